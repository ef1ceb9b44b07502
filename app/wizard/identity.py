"""Who is calling: the identity the reverse proxy vouches for.

nginx sets `Remote-User` (and `Remote-Groups`) on every request it passes on,
overwriting whatever the client sent; anonymous visitors arrive as `public` with no
groups. The service binds loopback only, so the header is trusted as it comes.

For diagnostics and tests, `X-Wiz-Test-User` / `X-Wiz-Test-Groups` replace them, but
only when WIZ_ALLOW_TEST_IDENTITY=1 and the request came straight from loopback: a
request that went through the proxy carries X-Forwarded-For / X-Real-IP (the proxy
always sets them, and strips the test headers too).
"""

import re
from dataclasses import dataclass

from flask import current_app, g, request

from app.common.clientaddr import is_loopback
from app.common.failures import Forbidden, Unauthenticated

ADMIN_GROUPS = frozenset({"admins", "wiz-admins"})
PUBLIC = "public"
# A user name as identity providers send it: printable, no separators we split on.
_USER_NAME = re.compile(r"^[^\x00-\x1f\x7f,|]{1,128}$")


@dataclass(frozen=True)
class Identity:
    id: str
    groups: frozenset

    @property
    def username(self):
        return self.id

    @property
    def is_admin(self):
        return bool(self.groups & ADMIN_GROUPS)

    @property
    def is_public(self):
        return self.id == PUBLIC

    def as_json(self):
        return {"id": self.id, "username": self.username, "is_admin": self.is_admin}


def parse_groups(value):
    """Group names separated by commas (Authelia), pipes (authentik) or semicolons
    (LemonLDAP::NG's multi-value separator, "; ")."""
    return frozenset(part.strip() for part in re.split(r"[,|;]", value or "") if part.strip())


def _test_identity_allowed():
    return (
        current_app.config["WIZARD"].allow_test_identity
        and is_loopback(request.remote_addr)
        and "X-Forwarded-For" not in request.headers
        and "X-Real-IP" not in request.headers
    )


def _headers():
    if "X-Wiz-Test-User" in request.headers and _test_identity_allowed():
        return request.headers.get("X-Wiz-Test-User"), request.headers.get("X-Wiz-Test-Groups", "")
    return request.headers.get("Remote-User"), request.headers.get("Remote-Groups", "")


def require_identity():
    """Resolve the caller into `g.identity`, or answer 401."""
    user, groups = _headers()
    user = (user or "").strip()
    if not user:
        raise Unauthenticated("authentication required: the request carries no trusted Remote-User header")
    if not _USER_NAME.match(user):
        raise Unauthenticated("the Remote-User header is not a valid user name")
    # Anonymous traffic has no groups, whatever a header says.
    g.identity = Identity(user, frozenset() if user == PUBLIC else parse_groups(groups))
    return g.identity


def current():
    return g.identity


def require_admin():
    if not g.identity.is_admin:
        raise Forbidden("administrators only (group admins or wiz-admins)")
