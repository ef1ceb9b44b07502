"""A podcast episode, made by the job worker (kind `podcast`): the language model
writes a dialogue from the notebook's sources and notes, each turn is spoken
(espeak-ng, one voice per speaker, or the default text_to_speech provider model when
one is set), and one MP3 is stored under DATA_DIR/podcasts. No Flask here."""

import os

from app.common import tts
from app.common.failures import Failure
from app.notebook import llm
from app.notebook.core import context, model_choice
from app.notebook.core.models import Episode, now, write_transaction
from app.notebook.core.podcast_profiles import ESPEAK_VOICES, PROVIDER_VOICES, SPEAKER_NAMES, TURNS
from app.notebook.worker.command_state import Canceled, complete, ensure_running, progress

TURN_CHARS = 1200
SPEECH_TIMEOUT = 60.0  # one turn through espeak-ng
DIALOGUE_PROMPT = (
    "You write the script of a podcast episode about the research material below. Reply with one JSON object "
    'and nothing else: {{"turns": [{{"speaker": "<name>", "text": "<what they say>"}}]}} with about {turns} '
    "turns. Speaker names: {names}. Use only facts from the material."
)
BRIEFING = " The host's briefing for this episode: {briefing}"


def make_episode(command, config):
    record = Episode.get_or_none(Episode.id == command.target.split(":", 1)[1])
    if record is None:
        raise Canceled(f"{command.target} was deleted")
    resolved = model_choice.resolve(config, "chat", record.model_id)
    names = SPEAKER_NAMES[: record.speakers]
    progress(command, "writing the script", 10)
    prompt = DIALOGUE_PROMPT.format(turns=TURNS[record.length], names=", ".join(names))
    if record.briefing:
        prompt += BRIEFING.format(briefing=record.briefing)
    turns = parse_turns(
        llm.chat(
            resolved.target,
            resolved.name,
            [{"role": "system", "content": prompt}, {"role": "user", "content": _material(record, config)}],
        ),
        names,
    )
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
            complete(
                command,
                {"episode_id": command.target, "turns": len(turns), "bytes": len(audio), "model_id": resolved.id},
                vectors_changed=False,
            )
    finally:
        if os.path.exists(partial):  # canceled (the episode deleted) or failed: no half file stays
            os.unlink(partial)


def _material(record, config):
    """What the episode talks about: the text its request gave (Open Notebook's UI sends
    the context it built), else the notebook's sources and notes."""
    if record.material:
        return record.material[: config.context_max_chars]
    return context.render_context(context.build_context(record.notebook_id, {}, config.context_max_chars))


def parse_turns(text, names):
    """The dialogue's turns ({speaker, text}), speakers mapped onto `names`."""
    script = llm.first_json_object(text)
    raw = script.get("turns") if isinstance(script, dict) else None
    turns = [
        {
            "speaker": t["speaker"] if t.get("speaker") in names else names[i % len(names)],
            "text": t["text"].strip()[:TURN_CHARS],
        }
        for i, t in enumerate(raw or [])
        if isinstance(t, dict) and isinstance(t.get("text"), str) and t["text"].strip()
    ]
    if not turns:
        raise llm.ProviderError(502, "the language model's script is not a dialogue (JSON with `turns`)")
    return turns[: max(TURNS.values())]


def _speak(turns, names, config):
    """The episode's MP3: the default text_to_speech model if one is set, else espeak-ng."""
    try:
        speech = model_choice.resolve(config, "text_to_speech")
    except Failure:
        speech = None
    if speech is not None:
        return b"".join(
            llm.speech(speech.target, speech.name, t["text"], PROVIDER_VOICES[names.index(t["speaker"])]) for t in turns
        )
    pcm, rate = bytearray(), None
    try:
        for turn in turns:
            wav = tts.espeak_wav(
                config.espeak_binary, turn["text"], ESPEAK_VOICES[names.index(turn["speaker"])], SPEECH_TIMEOUT
            )
            samples, rate, _ = tts.pcm_of_wav(wav)
            pcm += samples + b"\x00\x00" * (rate // 3)  # a third of a second between turns
        return tts.encode(bytes(pcm), rate)
    except tts.SpeechFailed as exc:
        raise llm.ProviderError(502, f"speech: {exc}") from None
