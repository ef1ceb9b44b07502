"""Record ids as the API shows them: `<table>:<key>` (`notebook:…`, `source:…`,
`note:…`, `command:…`), the key being 20 random lowercase letters and digits."""

import re
import secrets
import string

from app.common.failures import NotFound

_ALPHABET = string.ascii_lowercase + string.digits
_KEY = re.compile(r"^[a-z0-9]{1,64}$")


def new_key():
    return "".join(secrets.choice(_ALPHABET) for _ in range(20))


def public(table, key):
    return f"{table}:{key}" if key else None


def key_of(table, public_id, what=None):
    """The key of `public_id`, which must read `<table>:<key>`; anything else is the
    404 an unknown id gets (a wrong prefix names no record of this table). A bare
    key is taken too: Open Notebook's clients sometimes send one."""
    value = public_id or ""
    prefix = f"{table}:"
    key = value[len(prefix) :] if value.startswith(prefix) else value
    if ":" in key or not _KEY.match(key):
        raise NotFound(f"{what or table} {value[:80]!r} not found")
    return key
