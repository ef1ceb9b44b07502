"""Notebooks: list, create, read, update, delete."""

from flask import Blueprint
from peewee import IntegrityError

from app.common.failures import Conflict, NotFound
from app.notebook.core import cleanup
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Notebook, now, write_transaction
from app.notebook.routes import serializers
from app.notebook.routes.http import body, query, settings
from app.notebook.routes.payloads import NotebookCreate, NotebookDeleteQuery, NotebookListQuery, NotebookUpdate

bp = Blueprint("notebooks", __name__)

_ORDER = {"updated": Notebook.updated, "created": Notebook.created, "name": Notebook.name_key}


def get_notebook(public_id):
    record = Notebook.get_or_none(Notebook.id == key_of("notebook", public_id))
    if record is None:
        raise NotFound(f"notebook {public_id[:80]!r} not found")
    return record


def _name_taken(name):
    return Conflict(f"a notebook named {name!r} already exists")


@bp.get("/notebooks")
def list_notebooks():
    """The notebooks, with their source and note counts, in the order asked, optionally archived or not."""
    args = query(NotebookListQuery)
    field, *direction = args["order_by"].lower().split()
    order = _ORDER[field].desc() if direction == ["desc"] else _ORDER[field].asc()
    selection = Notebook.select().order_by(order)
    if "archived" in args:
        selection = selection.where(Notebook.archived == args["archived"])
    records = list(selection)
    sources, notes = serializers.notebook_counts([r.id for r in records])
    return [serializers.notebook(r, sources.get(r.id, 0), notes.get(r.id, 0)) for r in records]


@bp.post("/notebooks")
def create_notebook():
    """Create a notebook; its name is unique regardless of case (201)."""
    data = body(NotebookCreate())
    try:
        record = Notebook.create(
            id=new_key(), name=data["name"], name_key=data["name"].casefold(), description=data["description"]
        )
    except IntegrityError:
        raise _name_taken(data["name"]) from None
    return serializers.notebook(record, 0, 0), 201


@bp.get("/notebooks/<notebook_id>")
def read_notebook(notebook_id):
    """One notebook with its source and note counts."""
    return serializers.notebook(get_notebook(notebook_id))


@bp.put("/notebooks/<notebook_id>")
def update_notebook(notebook_id):
    """Rename, describe, archive or unarchive a notebook."""
    record = get_notebook(notebook_id)
    data = body(NotebookUpdate())
    if "name" in data:
        record.name, record.name_key = data["name"], data["name"].casefold()
    for field in ("description", "archived"):
        if field in data:
            setattr(record, field, data[field])
    record.updated = now()
    try:
        record.save()
    except IntegrityError:
        raise _name_taken(data["name"]) from None
    return serializers.notebook(record)


@bp.delete("/notebooks/<notebook_id>")
def delete_notebook(notebook_id):
    """Its notes go. Sources only it holds are kept (in no notebook) unless the caller
    asks to delete them (`delete_exclusive_sources=true`); shared ones are unlinked.
    The answer says what happened to each."""
    args = query(NotebookDeleteQuery)
    record = get_notebook(notebook_id)
    with write_transaction():
        removed = cleanup.delete_notebook(record, settings().uploads_dir, args["delete_exclusive_sources"])
    cleanup.remove_files(removed.pop("files"))
    kept = removed["kept_sources"]
    message = (
        f"Notebook deleted; {removed['deleted_notes']} note(s) and {removed['deleted_sources']} "
        f"source(s) deleted, {removed['unlinked_sources']} shared source(s) unlinked"
        + (f", {kept} source(s) that only it held kept (delete_exclusive_sources=true deletes them)" if kept else "")
    )
    return {"message": message, "deleted": public("notebook", record.id), **removed}
