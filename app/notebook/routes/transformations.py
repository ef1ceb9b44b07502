"""Transformations (`transformation:<key>`): a user's prompt applied to a text.
`POST /transformations/execute` answers at once; `POST /sources/{id}/insights`
runs as a background job (kind `insight`) that stores an insight on the source.

The prompt is data: it goes to the model as the system message, exactly as the
user wrote it, and is never rendered as a template (Open Notebook renders it with
Jinja, so braces in a prompt break or, worse, evaluate)."""

from flask import Blueprint

from app.common.failures import Conflict, Invalid, NotFound
from app.notebook.core import model_choice
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Insight, InsightRequest, Transformation, now, write_transaction
from app.notebook.core.records import get_source, get_transformation
from app.notebook.core.transform import (
    default_instructions,
    messages_for,
    model_override,
    set_default_instructions,
)
from app.notebook.routes import serializers
from app.notebook.routes.http import body, jobs, settings
from app.notebook.routes.payloads import (
    DefaultPrompt,
    InsightCreate,
    TransformationCreate,
    TransformationExecute,
    TransformationUpdate,
)

bp = Blueprint("transformations", __name__)


def _model_field(data):
    """`model_id` of a create or update as the column's value (checked: a language model)."""
    model_id = data.pop("model_id")
    return model_choice.choose("transformation", model_id, "model_id").id if model_id else None


def _unique_name(name, except_key=None):
    clash = Transformation.select().where(Transformation.name == name)
    if except_key:
        clash = clash.where(Transformation.id != except_key)
    if clash.exists():
        raise Conflict(f"a transformation named {name!r} exists already")


@bp.get("/transformations")
def list_transformations():
    """The transformations (named prompts applied to a text), by name."""
    ordered = Transformation.select().order_by(Transformation.name, Transformation.id)
    return [serializers.transformation(t) for t in ordered]


@bp.post("/transformations")
def create_transformation():
    """Create a transformation; its name is unique (201)."""
    data = body(TransformationCreate())
    data["model"] = _model_field(data) if "model_id" in data else None
    with write_transaction():
        _unique_name(data["name"])
        record = Transformation.create(id=new_key(), **data)
    return serializers.transformation(record), 201


@bp.get("/transformations/default-prompt")
def read_default_prompt():
    """The instructions put before every transformation's prompt (Open Notebook's default prompt)."""
    return {"transformation_instructions": default_instructions()}


@bp.put("/transformations/default-prompt")
def update_default_prompt():
    """Set the instructions put before every transformation's prompt (empty: none)."""
    data = body(DefaultPrompt())
    with write_transaction():
        set_default_instructions(data["transformation_instructions"])
    return {"transformation_instructions": default_instructions()}


@bp.get("/transformations/<transformation_id>")
def read_transformation(transformation_id):
    """One transformation."""
    return serializers.transformation(get_transformation(transformation_id))


@bp.put("/transformations/<transformation_id>")
def update_transformation(transformation_id):
    """Change a transformation's name, prompt, model or other fields."""
    record = get_transformation(transformation_id)
    data = body(TransformationUpdate())
    if "model_id" in data:  # null clears it
        data["model"] = _model_field(data)
    with write_transaction():
        if "name" in data:
            _unique_name(data["name"], record.id)
        Transformation.update(updated=now(), **data).where(Transformation.id == record.id).execute()
    return serializers.transformation(Transformation.get_by_id(record.id))


@bp.delete("/transformations/<transformation_id>")
def delete_transformation(transformation_id):
    """Insights it made stay (they no longer name it)."""
    record = get_transformation(transformation_id)
    Transformation.delete().where(Transformation.id == record.id).execute()
    return {"deleted": public("transformation", record.id)}


@bp.post("/transformations/execute")
def execute_transformation():
    """Apply a transformation to a text now, with its model or the default one, and answer the output."""
    data = body(TransformationExecute())
    record = get_transformation(data["transformation_id"], "transformation_id")
    resolved = model_choice.resolve(settings(), "transformation", model_override(record, data.get("model_id")))
    output = model_choice.complete(
        resolved, messages_for(record.prompt, data["input_text"], settings().context_max_chars)
    )
    return {"output": output, "transformation_id": public("transformation", record.id), "model_id": resolved.id}


# --------------------------------------------------------------------------- insights


def request_insights(source_key, transformation_ids, model_id):
    """At a source's creation (inside its transaction): the transformations it asks
    for, checked now (unknown ones are a 404 that creates nothing), queued once the
    source is processed."""
    for public_id in transformation_ids:
        transformation = get_transformation(public_id, "transformations")
        # No usable model: the 400 comes now, not as a failed job.
        model_choice.choose("transformation", model_override(transformation, model_id))
        InsightRequest.create(source=source_key, transformation=transformation.id, model_id=model_id)


@bp.post("/sources/<source_id>/insights")
def create_insight(source_id):
    """Apply a transformation to a source's text and store the output as an insight of the source."""
    source = get_source(source_id)
    data = body(InsightCreate())
    transformation = get_transformation(data["transformation_id"], "transformation_id")
    resolved = model_choice.resolve(settings(), "transformation", model_override(transformation, data.get("model_id")))
    if not (source.full_text or "").strip():
        raise Invalid(
            f"{public('source', source.id)} has no text yet (status {source.status}): "
            "transformations apply to processed sources"
        )
    with write_transaction():
        command = jobs().new_command("insight", public("source", source.id))
        InsightRequest.create(
            source=source.id, transformation=transformation.id, model_id=data.get("model_id"), command_id=command.id
        )
    jobs().enqueue(command)
    return {
        "status": "pending",
        "message": "Insight generation started",
        "command_id": public("command", command.id),
        "source_id": public("source", source.id),
        "transformation_id": public("transformation", transformation.id),
        "model_id": resolved.id,
    }, 202


@bp.get("/sources/<source_id>/insights")
def list_insights(source_id):
    """A source's insights, oldest first."""
    source = get_source(source_id)
    return [
        serializers.insight(i)
        for i in Insight.select().where(Insight.source == source.id).order_by(Insight.created, Insight.id)
    ]


def get_insight(public_id):
    record = Insight.get_or_none(Insight.id == key_of("insight", public_id))
    if record is None:
        raise NotFound(f"insight {public_id[:80]!r} not found")
    return record


@bp.get("/insights/<insight_id>")
def read_insight(insight_id):
    """One insight."""
    return serializers.insight(get_insight(insight_id))


@bp.delete("/insights/<insight_id>")
def delete_insight(insight_id):
    """Delete an insight."""
    record = get_insight(insight_id)
    Insight.delete().where(Insight.id == record.id).execute()
    return {"deleted": public("insight", record.id)}
