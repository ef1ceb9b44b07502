"""Routes of the podcasts: `POST /podcasts/generate` starts a job (kind `podcast`,
app.notebook.worker.episodes) that writes and speaks an episode; the episodes and their MP3."""

import os

from flask import Blueprint, send_file

from app.common.failures import Invalid, NotFound
from app.notebook.core import context, model_choice
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Command, Episode, now, write_transaction
from app.notebook.routes import serializers
from app.notebook.routes.http import body, jobs, settings
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.payloads import PodcastCreate

bp = Blueprint("podcasts", __name__)


def get_episode(public_id):
    record = Episode.get_or_none(Episode.id == key_of("episode", public_id))
    if record is None:
        raise NotFound(f"episode {public_id[:80]!r} not found")
    return record


def _view(record):
    status = (
        Command.select(Command.status).where(Command.id == record.command_id).scalar() if record.command_id else None
    )
    return serializers.episode(record, status)


def audio_path(config, record):
    return os.path.join(config.podcasts_dir, record.audio_file) if record.audio_file else None


@bp.post("/podcasts/generate")
def generate():
    """Queue a podcast episode about a notebook's sources and notes; 202 with the job's and the episode's ids."""
    data = body(PodcastCreate())
    notebook = get_notebook(data["notebook_id"])
    resolved = model_choice.resolve(settings(), "chat", data.get("model_id"))
    if not context.render_context(context.build_context(notebook.id, {}, 1)):
        raise Invalid("the notebook has no sources or notes to talk about")
    with write_transaction():
        # The override's key (Episode.model_id holds 20 characters), resolved again by the job.
        record = Episode.create(
            id=new_key(),
            name=data["episode_name"],
            notebook=notebook.id,
            speakers=data["speakers"],
            length=data["length"],
            model_id=resolved.record.id if data.get("model_id") else None,
        )
        command = jobs().new_command("podcast", public("episode", record.id))
        Episode.update(command_id=command.id).where(Episode.id == record.id).execute()
    jobs().enqueue(command)
    return {
        "command_id": public("command", command.id),
        "episode_id": public("episode", record.id),
        "model_id": resolved.id,
        "status": "new",
    }, 202


@bp.get("/podcasts/episodes")
def list_episodes():
    """The podcast episodes, newest first."""
    return [_view(e) for e in Episode.select().order_by(Episode.created.desc(), Episode.id)]


@bp.get("/podcasts/episodes/<episode_id>")
def read_episode(episode_id):
    """One podcast episode and its job's state."""
    return _view(get_episode(episode_id))


@bp.get("/podcasts/episodes/<episode_id>/audio")
def episode_audio(episode_id):
    """An episode's MP3 (404 until it is made)."""
    path = audio_path(settings(), get_episode(episode_id))
    if not path or not os.path.isfile(path):
        raise NotFound("this episode has no audio (yet)")
    return send_file(path, mimetype="audio/mpeg", conditional=True, max_age=0)


@bp.delete("/podcasts/episodes/<episode_id>")
def delete_episode(episode_id):
    """Its unfinished job is canceled; its MP3 goes."""
    record = get_episode(episode_id)
    with write_transaction():
        # Read again inside the transaction: a job that finished since has stored its file.
        audio_file = Episode.select(Episode.audio_file).where(Episode.id == record.id).scalar()
        (
            Command.update(status="canceled", error_message="the episode was deleted", updated=now())
            .where((Command.id == record.command_id) & Command.status.in_(("new", "running")))
            .execute()
        )
        Episode.delete().where(Episode.id == record.id).execute()
    path = os.path.join(settings().podcasts_dir, audio_file) if audio_file else None
    if path and os.path.exists(path):
        os.unlink(path)
    return {"deleted": public("episode", record.id)}
