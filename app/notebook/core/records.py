"""Look-ups of the records that several route modules and jobs share, by public id:
404 naming the field when there is none (so that no route module imports another for them)."""

from app.common.failures import NotFound
from app.notebook.core.ids import key_of
from app.notebook.core.models import Source, Transformation


def get_source(public_id, fields=None):
    selection = Source.select(*(fields or []))
    record = selection.where(Source.id == key_of("source", public_id)).first()
    if record is None:
        raise NotFound(f"source {public_id[:80]!r} not found")
    return record


def get_transformation(public_id, field=None):
    record = Transformation.get_or_none(Transformation.id == key_of("transformation", public_id))
    if record is None:
        prefix = f"{field}: " if field else ""
        raise NotFound(f"{prefix}transformation {public_id[:80]!r} not found", field=field)
    return record
