"""Podcasts: `POST /podcasts/generate` starts a job (kind `podcast`) that has the
language model write a dialogue from the notebook's sources and notes, speaks
each turn (espeak-ng, one voice per speaker, or the default text_to_speech
provider model when one is set) and stores one MP3 under DATA_DIR/podcasts."""
import json
import os

from flask import send_file

from app.common import tts
from app.common.errors import ApiError
from app.notebook import bp, chat, llm, model_config, views
from app.notebook.command_state import Canceled, complete, ensure_running, progress
from app.notebook.http import body, jobs, settings
from app.notebook.ids import key_of, new_key, public
from app.notebook.models import Command, Episode, now, write_transaction
from app.notebook.notebooks import get_notebook
from app.notebook.schemas import PodcastCreate

SPEAKER_NAMES = ("Alex", "Sam", "Robin", "Kim")
ESPEAK_VOICES = ("en-us", "en-gb+m3", "en-us+f3", "en-gb+f4")
PROVIDER_VOICES = ("alloy", "echo", "fable", "nova")
TURNS = {"short": 6, "medium": 12, "long": 24}
TURN_CHARS = 1200
SPEECH_TIMEOUT = 60.0  # one turn through espeak-ng
DIALOGUE_PROMPT = (
    "You write the script of a podcast episode about the research material below. Reply with one JSON object "
    'and nothing else: {{"turns": [{{"speaker": "<name>", "text": "<what they say>"}}]}} with about {turns} '
    "turns. Speaker names: {names}. Use only facts from the material.")


def get_episode(public_id):
    record = Episode.get_or_none(Episode.id == key_of("episode", public_id))
    if record is None:
        raise ApiError(404, f"episode {public_id[:80]!r} not found")
    return record


def _view(record):
    status = (Command.select(Command.status).where(Command.id == record.command_id).scalar()
              if record.command_id else None)
    return views.episode(record, status)


def audio_path(config, record):
    return os.path.join(config.podcasts_dir, record.audio_file) if record.audio_file else None


@bp.post("/podcasts/generate")
def generate():
    data = body(PodcastCreate())
    notebook = get_notebook(data["notebook_id"])
    resolved = model_config.resolve(settings(), "chat", data.get("model_id"))
    if not chat.render_context(chat.build_context(notebook.id, {}, 1)):
        raise ApiError(400, "the notebook has no sources or notes to talk about")
    with write_transaction():
        # The override's key (Episode.model_id holds 20 characters), resolved again by the job.
        record = Episode.create(id=new_key(), name=data["episode_name"], notebook=notebook.id,
                                speakers=data["speakers"], length=data["length"],
                                model_id=resolved.record.id if data.get("model_id") else None)
        command = jobs().new_command("podcast", public("episode", record.id))
        Episode.update(command_id=command.id).where(Episode.id == record.id).execute()
    jobs().enqueue(command)
    return {"command_id": public("command", command.id), "episode_id": public("episode", record.id),
            "model_id": resolved.id, "status": "new"}, 202


@bp.get("/podcasts/episodes")
def list_episodes():
    return [_view(e) for e in Episode.select().order_by(Episode.created.desc(), Episode.id)]


@bp.get("/podcasts/episodes/<episode_id>")
def read_episode(episode_id):
    return _view(get_episode(episode_id))


@bp.get("/podcasts/episodes/<episode_id>/audio")
def episode_audio(episode_id):
    path = audio_path(settings(), get_episode(episode_id))
    if not path or not os.path.isfile(path):
        raise ApiError(404, "this episode has no audio (yet)")
    return send_file(path, mimetype="audio/mpeg", conditional=True, max_age=0)


@bp.delete("/podcasts/episodes/<episode_id>")
def delete_episode(episode_id):
    """Its unfinished job is canceled; its MP3 goes."""
    record = get_episode(episode_id)
    with write_transaction():
        # Read again inside the transaction: a job that finished since has stored its file.
        audio_file = Episode.select(Episode.audio_file).where(Episode.id == record.id).scalar()
        (Command.update(status="canceled", error_message="the episode was deleted", updated=now())
         .where((Command.id == record.command_id) & Command.status.in_(("new", "running"))).execute())
        Episode.delete().where(Episode.id == record.id).execute()
    path = os.path.join(settings().podcasts_dir, audio_file) if audio_file else None
    if path and os.path.exists(path):
        os.unlink(path)
    return {"deleted": public("episode", record.id)}


# --------------------------------------------------------------------------- the job (worker)

def make_episode(command, config):
    record = Episode.get_or_none(Episode.id == command.target.split(":", 1)[1])
    if record is None:
        raise Canceled(f"{command.target} was deleted")
    resolved = model_config.resolve(config, "chat", record.model_id)
    names = SPEAKER_NAMES[:record.speakers]
    material = chat.render_context(chat.build_context(record.notebook_id, {}, config.context_max_chars))
    progress(command, "writing the script", 10)
    prompt = DIALOGUE_PROMPT.format(turns=TURNS[record.length], names=", ".join(names))
    turns = parse_turns(llm.chat(resolved.target, resolved.name, [{"role": "system", "content": prompt},
                                                                  {"role": "user", "content": material}]), names)
    progress(command, "speaking", 40)
    audio = _speak(turns, names, config)
    os.makedirs(config.podcasts_dir, exist_ok=True)
    name = f"{record.id}.mp3"
    partial = os.path.join(config.podcasts_dir, name + ".part")
    try:
        with open(partial, "wb") as f:
            f.write(audio)
        with write_transaction():
            ensure_running(command)
            os.replace(partial, os.path.join(config.podcasts_dir, name))
            Episode.update(transcript=turns, audio_file=name, updated=now()).where(Episode.id == record.id).execute()
            complete(command, {"episode_id": command.target, "turns": len(turns),
                                           "bytes": len(audio), "model_id": resolved.id}, vectors_changed=False)
    finally:
        if os.path.exists(partial):  # canceled (the episode deleted) or failed: no half file stays
            os.unlink(partial)


def parse_turns(text, names):
    """The dialogue's turns ({speaker, text}), speakers mapped onto `names`."""
    start = text.find("{")
    try:
        script, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except ValueError:
        script = None
    raw = script.get("turns") if isinstance(script, dict) else None
    turns = [{"speaker": t["speaker"] if t.get("speaker") in names else names[i % len(names)],
              "text": t["text"].strip()[:TURN_CHARS]}
             for i, t in enumerate(raw or []) if isinstance(t, dict) and isinstance(t.get("text"), str)
             and t["text"].strip()]
    if not turns:
        raise llm.ProviderError(502, "the language model's script is not a dialogue (JSON with `turns`)")
    return turns[:max(TURNS.values())]


def _speak(turns, names, config):
    """The episode's MP3: the default text_to_speech model if one is set, else espeak-ng."""
    try:
        speech = model_config.resolve(config, "text_to_speech")
    except ApiError:
        speech = None
    if speech is not None:
        return b"".join(llm.speech(speech.target, speech.name, t["text"], PROVIDER_VOICES[names.index(t["speaker"])])
                        for t in turns)
    pcm, rate = bytearray(), None
    try:
        for turn in turns:
            wav = tts.espeak_wav(config.espeak_binary, turn["text"], ESPEAK_VOICES[names.index(turn["speaker"])],
                                 SPEECH_TIMEOUT)
            samples, rate, _ = tts.pcm_of_wav(wav)
            pcm += samples + b"\x00\x00" * (rate // 3)  # a third of a second between turns
        return tts.encode(bytes(pcm), rate)
    except tts.SpeechFailed as exc:
        raise llm.ProviderError(502, f"speech: {exc}") from None
