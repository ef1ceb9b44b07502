"""Routes of the podcasts: `POST /podcasts/generate` starts a job (kind `podcast`,
app.notebook.worker.episodes) that writes and speaks an episode; the episodes and their
MP3; the built-in episode and speaker profiles and the languages, read-only, in Open
Notebook's shapes (app.notebook.core.podcast_profiles)."""

import os

from flask import Blueprint, send_file

from app.common.failures import ApiError, Conflict, Invalid, NotFound
from app.notebook.core import context, model_choice, podcast_profiles
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Command, Episode, now, write_transaction
from app.notebook.routes import serializers
from app.notebook.routes.http import body, enqueue, jobs, settings
from app.notebook.routes.model_config import current_defaults
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.payloads import PodcastCreate

bp = Blueprint("podcasts", __name__)


def get_episode(public_id):
    record = Episode.get_or_none(Episode.id == key_of("episode", public_id))
    if record is None:
        raise NotFound(f"episode {public_id[:80]!r} not found")
    return record


def _models() -> podcast_profiles.Models:
    """The defaults an episode is made with now (the profiles name them)."""
    defaults = current_defaults()
    return podcast_profiles.Models(
        chat=defaults["default_chat_model"], text_to_speech=defaults["default_text_to_speech_model"]
    )


def _view(record, models=None):
    job = Command.get_or_none(Command.id == record.command_id) if record.command_id else None
    return serializers.episode(
        record, models or _models(), job.status if job else None, job.error_message if job else None
    )


def audio_path(config, record):
    return os.path.join(config.podcasts_dir, record.audio_file) if record.audio_file else None


@bp.post("/podcasts/generate")
def generate():
    """Queue a podcast episode about a notebook's sources and notes; 202 with the job's and the episode's ids
    (503 when the job queue is down: the episode is kept with its job failed, to retry)."""
    data = body(PodcastCreate())
    notebook = get_notebook(data["notebook_id"]) if data.get("notebook_id") else None
    resolved = model_choice.resolve(settings(), "chat", data.get("model_id"))
    if not data.get("content") and not context.render_context(context.build_context(notebook.id, {}, 1)):
        raise Invalid("the notebook has no sources or notes to talk about")
    with write_transaction():
        # The override's key (Episode.model_id holds 20 characters), resolved again by the job.
        record = Episode.create(
            id=new_key(),
            name=data["episode_name"],
            notebook=notebook.id if notebook else None,
            speakers=data["speakers"],
            length=data["length"],
            model_id=resolved.record.id if data.get("model_id") else None,
            material=data.get("content"),
            briefing=data.get("briefing_suffix") or None,
        )
        command = jobs().new_command("podcast", public("episode", record.id))
        Episode.update(command_id=command.id).where(Episode.id == record.id).execute()
    enqueue(command)
    command_id = public("command", command.id)
    return {
        "command_id": command_id,
        "job_id": command_id,
        "episode_id": public("episode", record.id),
        "episode_name": record.name,
        "episode_profile": record.length,
        "model_id": resolved.id,
        "status": "new",
        "message": f"podcast generation started for episode {record.name!r}",
    }, 202


@bp.get("/podcasts/episodes")
def list_episodes():
    """The podcast episodes, newest first."""
    models = _models()
    return [_view(e, models) for e in Episode.select().order_by(Episode.created.desc(), Episode.id)]


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


def _check_retryable(record) -> None:
    """Inside the write transaction: the episode as it is now may be made again only
    when its job failed or was canceled, or is gone without having made it (no audio:
    the episode's own state decides, not a command row that may have been purged)."""
    current = Episode.get_or_none(Episode.id == record.id)
    if current is None:
        raise NotFound(f"episode {public('episode', record.id)!r} not found")
    if current.command_id != record.command_id:
        raise Conflict("this episode is being made again already")
    status = Command.select(Command.status).where(Command.id == current.command_id).scalar()
    if status in ("new", "running"):
        raise Conflict(f"this episode is being made already (its job is {status})")
    if current.audio_file or status == "completed":
        raise Invalid("only a failed or canceled episode can be made again; this one is completed")


@bp.post("/podcasts/episodes/<episode_id>/retry")
def retry_episode(episode_id):
    """Make a failed (or canceled) episode again: a new job, compare-and-set on the old
    one, so of two retries at once one starts a job and the other is a 409."""
    record = get_episode(episode_id)
    with write_transaction():
        _check_retryable(record)
        command = jobs().new_command("podcast", public("episode", record.id))
        claimed = (
            Episode.update(command_id=command.id, updated=now())
            .where((Episode.id == record.id) & (Episode.command_id == record.command_id))
            .execute()
        )
        if not claimed:  # raising rolls the new command back
            raise Conflict("this episode is being made again already")
    enqueue(command)
    command_id = public("command", command.id)
    return {"job_id": command_id, "command_id": command_id, "message": "the episode is being made again"}, 202


# --------------------------------------------------------------------------- profiles (built in)


def _read_only():
    raise ApiError(
        405,
        "the podcast profiles are built in and read-only here: an episode profile is a length "
        "(short, medium, long), a speaker profile a number of speakers (1 to 4)",
    )


@bp.get("/episode-profiles")
def list_episode_profiles():
    """The built-in episode profiles: one per length."""
    return podcast_profiles.episode_profiles(_models())


@bp.get("/episode-profiles/<profile_id>")
def read_episode_profile(profile_id):
    """A built-in episode profile by id or name."""
    length = podcast_profiles.length_of(profile_id)
    if length is None:
        raise NotFound(f"episode profile {profile_id[:80]!r} not found")
    return podcast_profiles.episode_profile(length, _models())


@bp.get("/speaker-profiles")
def list_speaker_profiles():
    """The built-in speaker profiles: one per number of speakers."""
    return podcast_profiles.speaker_profiles(_models())


@bp.get("/speaker-profiles/<profile_id>")
def read_speaker_profile(profile_id):
    """A built-in speaker profile by id or name."""
    speakers = podcast_profiles.speakers_of(profile_id)
    if speakers is None:
        raise NotFound(f"speaker profile {profile_id[:80]!r} not found")
    return podcast_profiles.speaker_profile(speakers, _models())


@bp.post("/episode-profiles")
@bp.post("/speaker-profiles")
@bp.put("/episode-profiles/<profile_id>")
@bp.put("/speaker-profiles/<profile_id>")
@bp.delete("/episode-profiles/<profile_id>")
@bp.delete("/speaker-profiles/<profile_id>")
@bp.post("/episode-profiles/<profile_id>/duplicate")
@bp.post("/speaker-profiles/<profile_id>/duplicate")
def change_profile(profile_id=None):
    """405: the profiles are built in."""
    _read_only()


@bp.get("/languages")
def list_languages():
    """The languages an episode can be made in."""
    return podcast_profiles.LANGUAGES
