"""The podcast episodes' built-in profiles, in Open Notebook's shapes (its web UI lists
them on the podcasts page and its generate dialog posts their names).

Open Notebook stores episode and speaker profiles as records a user edits. Ours has
two knobs, an episode's length and its number of speakers, and speaks with espeak-ng
or the default text_to_speech model: so the profiles here are fixed, one episode
profile per length and one speaker profile per number of speakers, and read-only
(docs/decisions/notebook.md). The job (app.notebook.worker.episodes) reads the same
constants, so a profile says exactly what an episode made from it gets."""

from dataclasses import dataclass

SPEAKER_NAMES = ("Alex", "Sam", "Robin", "Kim")
ESPEAK_VOICES = ("en-us", "en-gb+m3", "en-us+f3", "en-gb+f4")
PROVIDER_VOICES = ("alloy", "echo", "fable", "nova")
TURNS = {"short": 6, "medium": 12, "long": 24}
LENGTHS = tuple(TURNS)
MAX_SPEAKERS = len(SPEAKER_NAMES)
DEFAULT_SPEAKERS = 2
# The script is asked for in English and espeak-ng's voices above are English ones.
LANGUAGES = [
    {"code": "en-US", "name": "English (United States)"},
    {"code": "en-GB", "name": "English (United Kingdom)"},
]
BUILT_IN_VOICE = "espeak-ng"  # the voice_model of a speaker profile when no text_to_speech default is set


@dataclass(frozen=True)
class Models:
    """The defaults an episode is made with, as public model ids (None: not set)."""

    chat: str | None
    text_to_speech: str | None


def episode_profile_id(length: str) -> str:
    return f"episode_profile:{length}"


def speaker_profile_id(speakers: int) -> str:
    return f"speaker_profile:{speakers}"


def speaker_profile_name(speakers: int) -> str:
    return "one speaker" if speakers == 1 else f"{speakers} speakers"


def episode_profile(length: str, models: Models) -> dict:
    return {
        "id": episode_profile_id(length),
        "name": length,
        "description": f"a {length} episode: about {TURNS[length]} turns of dialogue",
        "speaker_config": speaker_profile_id(DEFAULT_SPEAKERS),
        "speaker_config_name": speaker_profile_name(DEFAULT_SPEAKERS),
        # Open Notebook's UI asks for setup while these are empty: they are the chat default here.
        "outline_llm": models.chat,
        "transcript_llm": models.chat,
        "language": LANGUAGES[0]["code"],
        # Open Notebook's profile form requires one: what our script's prompt asks for.
        "default_briefing": "A conversation about the material, using only its facts.",
        "num_segments": TURNS[length],
        "max_tokens": None,
    }


def speaker_profile(speakers: int, models: Models) -> dict:
    voices = PROVIDER_VOICES if models.text_to_speech else ESPEAK_VOICES
    return {
        "id": speaker_profile_id(speakers),
        "name": speaker_profile_name(speakers),
        "description": "voices of the default text_to_speech model"
        if models.text_to_speech
        else "espeak-ng's voices (no text_to_speech default is set)",
        "voice_model": models.text_to_speech or BUILT_IN_VOICE,
        "speakers": [
            {"name": SPEAKER_NAMES[i], "voice_id": voices[i], "backstory": "", "personality": ""}
            for i in range(speakers)
        ],
    }


def episode_profiles(models: Models) -> list[dict]:
    return [episode_profile(length, models) for length in LENGTHS]


def speaker_profiles(models: Models) -> list[dict]:
    return [speaker_profile(n, models) for n in range(1, MAX_SPEAKERS + 1)]


def length_of(reference: str) -> str | None:
    """The length an episode profile's id or name stands for; None if it is no profile."""
    name = reference.removeprefix("episode_profile:")
    return name if name in TURNS else None


def speakers_of(reference: str) -> int | None:
    """The number of speakers a speaker profile's id or name stands for; None if it is no profile."""
    for n in range(1, MAX_SPEAKERS + 1):
        if reference in (speaker_profile_id(n), speaker_profile_name(n)):
            return n
    return None
