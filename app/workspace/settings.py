"""The workspace platform's configuration, read once from the environment at start."""
import ipaddress
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.common.config import ConfigError, env_bool, env_int, env_str

MESH_SECRET_MIN = 16
APP_TOKEN_SECRET_MIN = 32
# `*.<domain>[:port]`: the wildcard is one whole DNS label (the app's), the rest a host name.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
WILDCARD = re.compile(rf"^\*((?:\.{_LABEL})+)(?::(\d{{1,5}}))?$")


@dataclass(frozen=True)
class WorkspaceSettings:
    database_url: str          # DATABASE_URL, default sqlite:///$DATA_DIR/workspace.db
    access_url: str            # WORKSPACE_ACCESS_URL: the public base address
    session_seconds: int       # WORKSPACE_SESSION_DURATION (seconds), default 24 h
    password_enabled: bool     # not WORKSPACE_DISABLE_PASSWORD_AUTH
    oidc_issuer: str           # WORKSPACE_OIDC_ISSUER_URL
    oidc_client_id: str        # WORKSPACE_OIDC_CLIENT_ID
    oidc_client_secret: str    # WORKSPACE_OIDC_CLIENT_SECRET (a secret: never logged or answered)
    oidc_scopes: tuple         # WORKSPACE_OIDC_SCOPES, comma-separated
    oidc_sign_in_text: str     # WORKSPACE_OIDC_SIGN_IN_TEXT
    oidc_icon_url: str         # WORKSPACE_OIDC_ICON_URL
    oidc_email_domains: tuple  # WORKSPACE_OIDC_EMAIL_DOMAIN, comma-separated; empty: no restriction
    login_per_address: int     # WORKSPACE_LOGIN_RATE_PER_ADDRESS: failures from one address (all accounts)
    #                            before each further attempt must wait
    login_per_account: int     # WORKSPACE_LOGIN_RATE_PER_ACCOUNT: failures for one account from one address
    #                            before each further attempt must wait
    login_delay_seconds: int   # WORKSPACE_LOGIN_DELAY_SECONDS: the first wait; doubled with each attempt
    login_max_delay_seconds: int  # WORKSPACE_LOGIN_MAX_DELAY_SECONDS: the longest wait
    agent_timeout_seconds: int  # WORKSPACE_AGENT_CONNECTION_TIMEOUT: a new agent is `timeout` past it
    agent_ping_seconds: int    # WORKSPACE_AGENT_PING_SECONDS: the platform pings each agent this often
    relay_idle_seconds: int    # WORKSPACE_RELAY_IDLE_SECONDS: a quiet relay pair is closed after it
    mesh_secret: str           # WORKSPACE_MESH_SECRET: what the workers' mesh is signed with (with REDIS_URL)
    mesh_address: str          # WORKSPACE_MESH_ADDRESS: this host's private address for the mesh; "": one host
    app_host_suffix: str       # WORKSPACE_WILDCARD_ACCESS_URL's `.<domain>` after `*`; "": apps on paths only
    app_host_port: str         # its `:port`, or ""
    app_token_secret: str      # WORKSPACE_APP_TOKEN_SECRET: what app tickets and tokens are sealed with; "": derived
    path_app_sharing: bool     # WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING
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
        oidc = {name: env_str(name) for name in ("WORKSPACE_OIDC_ISSUER_URL", "WORKSPACE_OIDC_CLIENT_ID",
                                                  "WORKSPACE_OIDC_CLIENT_SECRET")}
        if any(oidc.values()) and not all(oidc.values()):
            missing = ", ".join(name for name, value in oidc.items() if not value)
            raise ConfigError(f"OIDC is half configured: {missing} must be set too (or none of the three)")
        access_url = env_str("WORKSPACE_ACCESS_URL", "http://127.0.0.1:7080").rstrip("/")
        if urlsplit(access_url).scheme not in ("http", "https") or not urlsplit(access_url).netloc:
            raise ConfigError(f"WORKSPACE_ACCESS_URL must be an http(s) URL, got {access_url!r}")
        mesh_secret = env_str("WORKSPACE_MESH_SECRET")
        if env_str("REDIS_URL") and len(mesh_secret) < MESH_SECRET_MIN:
            raise ConfigError(f"WORKSPACE_MESH_SECRET must be set (at least {MESH_SECRET_MIN} characters, the same on"
                              " every host) when REDIS_URL is: the workers carry agents' requests to each other")
        login_delay = env_int("WORKSPACE_LOGIN_DELAY_SECONDS", 1, minimum=1, maximum=24 * 3600)
        return cls(
            database_url=env_str("DATABASE_URL", "sqlite:///" + os.path.join(data_dir, "workspace.db")),
            access_url=access_url,
            session_seconds=env_int("WORKSPACE_SESSION_DURATION", 24 * 3600, minimum=60),
            password_enabled=not env_bool("WORKSPACE_DISABLE_PASSWORD_AUTH"),
            oidc_issuer=env_str("WORKSPACE_OIDC_ISSUER_URL").rstrip("/"),
            oidc_client_id=env_str("WORKSPACE_OIDC_CLIENT_ID"),
            oidc_client_secret=env_str("WORKSPACE_OIDC_CLIENT_SECRET"),
            oidc_scopes=tuple(s.strip() for s in env_str("WORKSPACE_OIDC_SCOPES", "openid,profile,email").split(",")
                              if s.strip()),
            oidc_sign_in_text=env_str("WORKSPACE_OIDC_SIGN_IN_TEXT", "OpenID Connect"),
            oidc_icon_url=env_str("WORKSPACE_OIDC_ICON_URL"),
            oidc_email_domains=tuple(d.strip().lower() for d in env_str("WORKSPACE_OIDC_EMAIL_DOMAIN").split(",")
                                     if d.strip()),
            login_per_address=env_int("WORKSPACE_LOGIN_RATE_PER_ADDRESS", 20, minimum=1),
            login_per_account=env_int("WORKSPACE_LOGIN_RATE_PER_ACCOUNT", 10, minimum=1),
            login_delay_seconds=login_delay,
            login_max_delay_seconds=env_int("WORKSPACE_LOGIN_MAX_DELAY_SECONDS", max(900, login_delay),
                                            minimum=login_delay, maximum=24 * 3600),
            agent_timeout_seconds=env_int("WORKSPACE_AGENT_CONNECTION_TIMEOUT", 120, minimum=1),
            agent_ping_seconds=env_int("WORKSPACE_AGENT_PING_SECONDS", 5, minimum=1, maximum=300),
            relay_idle_seconds=env_int("WORKSPACE_RELAY_IDLE_SECONDS", 300, minimum=1),
            mesh_secret=mesh_secret,
            mesh_address=_mesh_address(),
            **_app_hosts(access_url),
            path_app_sharing=env_bool("WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING"),
            path_app_site_owner_access=env_bool("WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS"),
        )


def _app_hosts(access_url):
    """The app hosts' settings: WORKSPACE_WILDCARD_ACCESS_URL (`*.apps.example.org[:port]`,
    the scheme is WORKSPACE_ACCESS_URL's) and the secret their tokens are sealed with."""
    value = env_str("WORKSPACE_WILDCARD_ACCESS_URL").strip().lower()
    match = WILDCARD.match(value)
    if value and not (match and 0 < int(match.group(2) or 1) < 65536):
        raise ConfigError("WORKSPACE_WILDCARD_ACCESS_URL must be a host pattern such as *.apps.example.org or"
                          f" *.apps.example.org:8443 (no scheme, no path), got {value[:80]!r}")
    suffix = match.group(1) if match else ""
    platform_host = (urlsplit(access_url).hostname or "").lower()
    if suffix and platform_host.endswith(suffix) and "." not in platform_host[:-len(suffix)]:
        raise ConfigError(f"WORKSPACE_ACCESS_URL's host {platform_host} is one of WORKSPACE_WILDCARD_ACCESS_URL's"
                          " app hosts: give apps a domain of their own (e.g. *.apps.<your domain>)")
    secret = env_str("WORKSPACE_APP_TOKEN_SECRET")
    if secret and len(secret) < APP_TOKEN_SECRET_MIN:
        raise ConfigError(f"WORKSPACE_APP_TOKEN_SECRET must be at least {APP_TOKEN_SECRET_MIN} characters")
    return {"app_host_suffix": suffix, "app_host_port": f":{match.group(2)}" if match and match.group(2) else "",
            "app_token_secret": secret}


def _mesh_address():
    value = env_str("WORKSPACE_MESH_ADDRESS").strip("[]")
    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ConfigError(f"WORKSPACE_MESH_ADDRESS must be an IP address of this host, got {value[:60]!r}") \
                from None
    return value
