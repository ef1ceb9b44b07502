"""The sample deck, copied into a deck service's DATA_DIR."""
import shutil
from pathlib import Path

from tests.support.shared import ROOT

SAMPLE_DECK = ROOT / "samples" / "decks" / "welcome"


def copy_sample_deck(data_dir, name="welcome"):
    """The sample deck's sources under DATA_DIR/sources/<name>; returns the import body."""
    target = Path(data_dir) / "sources" / name
    shutil.copytree(SAMPLE_DECK, target)
    return {"id": name, "md_path": f"sources/{name}/deck.md", "copy_from": f"sources/{name}"}


def decks_with_sample(starter, data_dir):
    """A deck service started by `starter` on `data_dir`, whose sources hold the sample
    deck (not yet imported): `service.import_body` imports it."""
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    service = starter("decks", data_dir=data_dir)
    service.import_body = body
    return service
