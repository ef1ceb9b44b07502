"""The workspace platform's configuration, read once from the environment at start.

Each variable is declared once below (name, default, bounds, meaning); the reference
in docs/services/workspace.md is written from these declarations (devtools.reference)."""

import ipaddress
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.common import config
from app.common.config import PROJECT_ROOT, ConfigError, Flag, Integer, Text

# The bundle's release, which the platform reports as its build (Coder's buildinfo).
VERSION = (PROJECT_ROOT / "VERSION").read_text().strip()

MESH_SECRET_MIN = 16
APP_TOKEN_SECRET_MIN = 32
# `*.<domain>[:port]`: the wildcard is one whole DNS label (the app's), the rest a host name.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
WILDCARD = re.compile(rf"^\*((?:\.{_LABEL})+)(?::(\d{{1,5}}))?$")

VARIABLES = config.Variables("workspace", includes=(config.SHARED,))
DATABASE_URL = VARIABLES.add(
    Text(
        name="DATABASE_URL",
        shown_default="`sqlite:///$DATA_DIR/workspace.db`",
        values="sqlite:/// or postgresql:// URL (several hosts too: postgresql://user:password@h1:5432,h2:5432/db)",
        doc="The platform's database. A secret when it holds a password.",
    )
)
ACCESS_URL = VARIABLES.add(
    Text(
        name="WORKSPACE_ACCESS_URL",
        default="http://127.0.0.1:7080",
        values="http(s) URL",
        doc="The platform's public base address: cookies are Secure when it is https, and the OIDC redirect URI "
        "is built from it.",
    )
)
SESSION_DURATION = VARIABLES.add(
    Integer(
        name="WORKSPACE_SESSION_DURATION",
        default=24 * 3600,
        minimum=60,
        doc="A session's lifetime in seconds; sliding: a token used with less than half its lifetime left is extended.",
    )
)
DISABLE_PASSWORD_AUTH = VARIABLES.add(
    Flag(
        name="WORKSPACE_DISABLE_PASSWORD_AUTH",
        doc="Turn password sign-in off (otherwise it stays as a fallback beside OIDC).",
    )
)
OIDC_ISSUER_URL = VARIABLES.add(
    Text(
        name="WORKSPACE_OIDC_ISSUER_URL",
        values="URL",
        doc="The OpenID Connect issuer. OIDC is on when it, the client id and the client secret are set; "
        "half of the three stops the start.",
    )
)
OIDC_CLIENT_ID = VARIABLES.add(Text(name="WORKSPACE_OIDC_CLIENT_ID", doc="The platform's OIDC client id."))
OIDC_CLIENT_SECRET = VARIABLES.add(
    Text(
        name="WORKSPACE_OIDC_CLIENT_SECRET",
        doc="The platform's OIDC client secret. A secret: never logged nor answered.",
    )
)
OIDC_SCOPES = VARIABLES.add(
    Text(
        name="WORKSPACE_OIDC_SCOPES",
        default="openid,profile,email",
        values="comma-separated scopes",
        doc="The scopes the platform asks the identity provider for.",
    )
)
OIDC_SIGN_IN_TEXT = VARIABLES.add(
    Text(
        name="WORKSPACE_OIDC_SIGN_IN_TEXT", default="OpenID Connect", doc="The label of the sign-in page's OIDC button."
    )
)
OIDC_ICON_URL = VARIABLES.add(
    Text(name="WORKSPACE_OIDC_ICON_URL", values="URL", doc="The icon of the sign-in page's OIDC button.")
)
OIDC_EMAIL_DOMAIN = VARIABLES.add(
    Text(
        name="WORKSPACE_OIDC_EMAIL_DOMAIN",
        values="comma-separated domains",
        doc="The e-mail domains an OIDC user must belong to; blank: no restriction.",
    )
)
LOGIN_RATE_PER_ADDRESS = VARIABLES.add(
    Integer(
        name="WORKSPACE_LOGIN_RATE_PER_ADDRESS",
        default=20,
        minimum=1,
        doc="Failed sign-ins from one address (all accounts) before each further attempt must wait (429 with "
        "Retry-After).",
    )
)
LOGIN_RATE_PER_ACCOUNT = VARIABLES.add(
    Integer(
        name="WORKSPACE_LOGIN_RATE_PER_ACCOUNT",
        default=10,
        minimum=1,
        doc="Failed sign-ins for one account from one address before each further attempt must wait.",
    )
)
LOGIN_DELAY_SECONDS = VARIABLES.add(
    Integer(
        name="WORKSPACE_LOGIN_DELAY_SECONDS",
        default=1,
        minimum=1,
        maximum=24 * 3600,
        doc="The first wait after too many failed sign-ins, in seconds; doubled with each attempt.",
    )
)
LOGIN_MAX_DELAY_SECONDS = VARIABLES.add(
    Integer(
        name="WORKSPACE_LOGIN_MAX_DELAY_SECONDS",
        default=900,
        maximum=24 * 3600,
        shown_default="`900`, or WORKSPACE_LOGIN_DELAY_SECONDS if larger",
        doc="The longest wait, in seconds; at least WORKSPACE_LOGIN_DELAY_SECONDS.",
    )
)
AGENT_CONNECTION_TIMEOUT = VARIABLES.add(
    Integer(
        name="WORKSPACE_AGENT_CONNECTION_TIMEOUT",
        default=120,
        minimum=1,
        doc="Seconds an agent that never connected stays `connecting` before it is `timeout`.",
    )
)
AGENT_PING_SECONDS = VARIABLES.add(
    Integer(
        name="WORKSPACE_AGENT_PING_SECONDS",
        default=5,
        minimum=1,
        maximum=300,
        doc="How often the platform pings each agent, in seconds; two unanswered pings close the connection.",
    )
)
AGENTS_PER_WORKER = VARIABLES.add(
    Integer(
        name="WORKSPACE_AGENTS_PER_WORKER",
        default=6000,  # of WORKER_CONNECTIONS' 8192: 10,000 agents on 2 workers, split unevenly, and room for users
        minimum=1,
        doc=(
            "The most agents' connections one web worker holds; past it, a new agent's websocket is closed with"
            " code 1013 (try again later) and the agent retries with backoff, perhaps on another worker. Keep it"
            " below the worker's WORKER_CONNECTIONS, with room for users' requests."
        ),
    )
)
RELAY_IDLE_SECONDS = VARIABLES.add(
    Integer(
        name="WORKSPACE_RELAY_IDLE_SECONDS",
        default=300,
        minimum=1,
        doc="How long a relay peer waits for its partner, and how long a pair may stay idle, in seconds.",
    )
)
MESH_SECRET = VARIABLES.add(
    Text(
        name="WORKSPACE_MESH_SECRET",
        values=f"at least {MESH_SECRET_MIN} characters",
        doc="What the workers' mesh is signed with, the same on every host; needed with REDIS_URL. A secret.",
    )
)
MESH_ADDRESS = VARIABLES.add(
    Text(
        name="WORKSPACE_MESH_ADDRESS",
        values="IP address",
        doc="With several application hosts: this host's private IP, where its workers listen for the others; "
        "blank: abstract unix sockets, one host.",
    )
)
WILDCARD_ACCESS_URL = VARIABLES.add(
    Text(
        name="WORKSPACE_WILDCARD_ACCESS_URL",
        values="*.apps.example.org[:port]",
        doc="Every app on a host of its own, under this pattern (the scheme is WORKSPACE_ACCESS_URL's); blank: "
        "apps on paths of the platform's host only.",
    )
)
APP_TOKEN_SECRET = VARIABLES.add(
    Text(
        name="WORKSPACE_APP_TOKEN_SECRET",
        values=f"at least {APP_TOKEN_SECRET_MIN} characters",
        doc="What app-host tickets and tokens are sealed with; blank: derived. A secret.",
    )
)
DANGEROUS_ALLOW_PATH_APP_SHARING = VARIABLES.add(
    Flag(name="WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING", doc="Serve shared path apps to other users (sandboxed).")
)
DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS = VARIABLES.add(
    Flag(
        name="WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS",
        doc="Let administrators open other users' path apps (sandboxed).",
    )
)


# Each field is the value of the variable its comment names (declared above, with its meaning).
@dataclass(frozen=True)
class WorkspaceSettings:
    database_url: str  # DATABASE_URL
    access_url: str  # WORKSPACE_ACCESS_URL
    session_seconds: int  # WORKSPACE_SESSION_DURATION
    password_enabled: bool  # not WORKSPACE_DISABLE_PASSWORD_AUTH
    oidc_issuer: str  # WORKSPACE_OIDC_ISSUER_URL
    oidc_client_id: str  # WORKSPACE_OIDC_CLIENT_ID
    oidc_client_secret: str  # WORKSPACE_OIDC_CLIENT_SECRET
    oidc_scopes: tuple  # WORKSPACE_OIDC_SCOPES
    oidc_sign_in_text: str  # WORKSPACE_OIDC_SIGN_IN_TEXT
    oidc_icon_url: str  # WORKSPACE_OIDC_ICON_URL
    oidc_email_domains: tuple  # WORKSPACE_OIDC_EMAIL_DOMAIN
    login_per_address: int  # WORKSPACE_LOGIN_RATE_PER_ADDRESS
    login_per_account: int  # WORKSPACE_LOGIN_RATE_PER_ACCOUNT
    login_delay_seconds: int  # WORKSPACE_LOGIN_DELAY_SECONDS
    login_max_delay_seconds: int  # WORKSPACE_LOGIN_MAX_DELAY_SECONDS
    agent_timeout_seconds: int  # WORKSPACE_AGENT_CONNECTION_TIMEOUT
    agent_ping_seconds: int  # WORKSPACE_AGENT_PING_SECONDS
    agents_per_worker: int  # WORKSPACE_AGENTS_PER_WORKER
    relay_idle_seconds: int  # WORKSPACE_RELAY_IDLE_SECONDS
    mesh_secret: str  # WORKSPACE_MESH_SECRET
    mesh_address: str  # WORKSPACE_MESH_ADDRESS
    app_host_suffix: str  # WORKSPACE_WILDCARD_ACCESS_URL's `.<domain>` after `*`; "": apps on paths only
    app_host_port: str  # its `:port`, or ""
    app_token_secret: str  # WORKSPACE_APP_TOKEN_SECRET
    path_app_sharing: bool  # WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING
    path_app_site_owner_access: bool  # WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS

    @property
    def oidc_enabled(self):
        return bool(self.oidc_issuer and self.oidc_client_id and self.oidc_client_secret)

    @property
    def secure_cookies(self):
        return urlsplit(self.access_url).scheme == "https"

    @property
    def app_hosts_enabled(self):
        return bool(self.app_host_suffix)

    def app_host_url(self, label):
        """The base URL of the app host whose first label is `label`."""
        return f"{urlsplit(self.access_url).scheme}://{label}{self.app_host_suffix}{self.app_host_port}"

    @classmethod
    def from_env(cls, data_dir):
        oidc = {v.name: v.read() for v in (OIDC_ISSUER_URL, OIDC_CLIENT_ID, OIDC_CLIENT_SECRET)}
        if any(oidc.values()) and not all(oidc.values()):
            missing = ", ".join(name for name, value in oidc.items() if not value)
            raise ConfigError(f"OIDC is half configured: {missing} must be set too (or none of the three)")
        access_url = ACCESS_URL.read().rstrip("/")
        if urlsplit(access_url).scheme not in ("http", "https") or not urlsplit(access_url).netloc:
            raise ConfigError(f"WORKSPACE_ACCESS_URL must be an http(s) URL, got {access_url!r}")
        mesh_secret = MESH_SECRET.read()
        if config.REDIS_URL.read() and len(mesh_secret) < MESH_SECRET_MIN:
            raise ConfigError(
                f"WORKSPACE_MESH_SECRET must be set (at least {MESH_SECRET_MIN} characters, the same on"
                " every host) when REDIS_URL is: the workers carry agents' requests to each other"
            )
        login_delay = LOGIN_DELAY_SECONDS.read()
        return cls(
            database_url=DATABASE_URL.read("sqlite:///" + os.path.join(data_dir, "workspace.db")),
            access_url=access_url,
            session_seconds=SESSION_DURATION.read(),
            password_enabled=not DISABLE_PASSWORD_AUTH.read(),
            oidc_issuer=OIDC_ISSUER_URL.read().rstrip("/"),
            oidc_client_id=OIDC_CLIENT_ID.read(),
            oidc_client_secret=OIDC_CLIENT_SECRET.read(),
            oidc_scopes=tuple(s.strip() for s in OIDC_SCOPES.read().split(",") if s.strip()),
            oidc_sign_in_text=OIDC_SIGN_IN_TEXT.read(),
            oidc_icon_url=OIDC_ICON_URL.read(),
            oidc_email_domains=tuple(d.strip().lower() for d in OIDC_EMAIL_DOMAIN.read().split(",") if d.strip()),
            login_per_address=LOGIN_RATE_PER_ADDRESS.read(),
            login_per_account=LOGIN_RATE_PER_ACCOUNT.read(),
            login_delay_seconds=login_delay,
            login_max_delay_seconds=LOGIN_MAX_DELAY_SECONDS.read(default=max(900, login_delay), minimum=login_delay),
            agent_timeout_seconds=AGENT_CONNECTION_TIMEOUT.read(),
            agent_ping_seconds=AGENT_PING_SECONDS.read(),
            agents_per_worker=AGENTS_PER_WORKER.read(),
            relay_idle_seconds=RELAY_IDLE_SECONDS.read(),
            mesh_secret=mesh_secret,
            mesh_address=_mesh_address(),
            **_app_hosts(access_url),
            path_app_sharing=DANGEROUS_ALLOW_PATH_APP_SHARING.read(),
            path_app_site_owner_access=DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS.read(),
        )


def _app_hosts(access_url):
    """The app hosts' settings: WORKSPACE_WILDCARD_ACCESS_URL (`*.apps.example.org[:port]`,
    the scheme is WORKSPACE_ACCESS_URL's) and the secret their tokens are sealed with."""
    value = WILDCARD_ACCESS_URL.read().strip().lower()
    match = WILDCARD.match(value)
    if value and not (match and 0 < int(match.group(2) or 1) < 65536):
        raise ConfigError(
            "WORKSPACE_WILDCARD_ACCESS_URL must be a host pattern such as *.apps.example.org or"
            f" *.apps.example.org:8443 (no scheme, no path), got {value[:80]!r}"
        )
    suffix = match.group(1) if match else ""
    platform_host = (urlsplit(access_url).hostname or "").lower()
    if suffix and platform_host.endswith(suffix) and "." not in platform_host[: -len(suffix)]:
        raise ConfigError(
            f"WORKSPACE_ACCESS_URL's host {platform_host} is one of WORKSPACE_WILDCARD_ACCESS_URL's"
            " app hosts: give apps a domain of their own (e.g. *.apps.<your domain>)"
        )
    secret = APP_TOKEN_SECRET.read()
    if secret and len(secret) < APP_TOKEN_SECRET_MIN:
        raise ConfigError(f"WORKSPACE_APP_TOKEN_SECRET must be at least {APP_TOKEN_SECRET_MIN} characters")
    return {
        "app_host_suffix": suffix,
        "app_host_port": f":{match.group(2)}" if match and match.group(2) else "",
        "app_token_secret": secret,
    }


def _mesh_address():
    value = MESH_ADDRESS.read().strip("[]")
    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ConfigError(
                f"WORKSPACE_MESH_ADDRESS must be an IP address of this host, got {value[:60]!r}"
            ) from None
    return value
