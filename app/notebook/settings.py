"""The notebook service's configuration, read once from the environment at start
(by the web workers and by the job worker alike)."""
import ipaddress
import os
from dataclasses import dataclass

from app.common.config import ConfigError, env_bool, env_choice, env_int, env_seconds, env_str

MB = 1024 * 1024


def _networks(name):
    """`name` (an allow-list variable): comma-separated addresses or networks (CIDR)."""
    raw = env_str(name)
    networks = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not an address or a network") from None
    return tuple(networks)


def _encryption_key():
    """NOTEBOOK_ENCRYPTION_KEY: a Fernet key (32 url-safe base64 bytes), or blank (no
    credential may then store an API key). A malformed key stops the start: keys
    encrypted with it could never be read again."""
    key = env_str("NOTEBOOK_ENCRYPTION_KEY")
    if key:
        from cryptography.fernet import Fernet
        try:
            Fernet(key.encode())
        except ValueError:
            raise ConfigError("NOTEBOOK_ENCRYPTION_KEY is not a Fernet key (32 url-safe base64-encoded bytes; "
                              "make one with `python -c 'from cryptography.fernet import Fernet; "
                              "print(Fernet.generate_key().decode())'`)") from None
    return key


def _origins(raw):
    origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ConfigError(f"NOTEBOOK_CORS_ORIGINS: {origin!r} is not an http(s) origin or *")
    return origins


@dataclass(frozen=True)
class NotebookSettings:
    data_dir: str
    database_url: str           # DATABASE_URL, default sqlite:///$DATA_DIR/notebook.db
    password: str               # NOTEBOOK_PASSWORD (a secret: never logged or answered)
    allow_no_password: bool     # NOTEBOOK_ALLOW_NO_PASSWORD=1: run without authentication
    cors_origins: tuple         # NOTEBOOK_CORS_ORIGINS: "*" (development) or exact origins
    max_upload_bytes: int       # NOTEBOOK_MAX_UPLOAD_BYTES, default 100 MB
    max_text_bytes: int         # NOTEBOOK_MAX_TEXT_BYTES: a body without a file (JSON, a form's text)
    max_source_chars: int       # NOTEBOOK_MAX_SOURCE_CHARS: a source's (or a note's) text, in characters
    max_expansion: int          # NOTEBOOK_MAX_EXPANSION: a document's inflated bytes / text per byte of file
    fetch_timeout: float        # NOTEBOOK_FETCH_TIMEOUT: a link's whole download
    fetch_max_bytes: int        # NOTEBOOK_FETCH_MAX_BYTES: a link's body
    url_allowlist: tuple        # NOTEBOOK_URL_ALLOWLIST: networks links may reach despite the SSRF guard
    chunk_size: int             # NOTEBOOK_CHUNK_SIZE: characters per chunk
    chunk_overlap: int          # NOTEBOOK_CHUNK_OVERLAP: characters shared by neighbouring chunks
    embedding_provider: str     # NOTEBOOK_EMBEDDING_PROVIDER: local | openai | none
    embedding_model: str        # NOTEBOOK_EMBEDDING_MODEL: the model's name (recorded with each vector)
    embedding_url: str          # NOTEBOOK_EMBEDDING_URL: base of an OpenAI-compatible API (…/v1)
    embedding_api_key: str      # NOTEBOOK_EMBEDDING_API_KEY (a secret)
    sync_timeout: float         # NOTEBOOK_SYNC_TIMEOUT: how long a synchronous add waits for the worker
    jobs_path: str              # NOTEBOOK_JOBS_DB: huey's SQLite queue, default $DATA_DIR/jobs.db
    redis_url: str              # REDIS_URL: the job queue on Redis instead (a secret: it holds a password)
    worker_threads: int         # NOTEBOOK_WORKER_THREADS: jobs run at once by the worker
    swagger_ui_dir: str         # NOTEBOOK_SWAGGER_UI_DIR: the swagger-ui-dist files
    encryption_key: str         # NOTEBOOK_ENCRYPTION_KEY: Fernet key of stored API keys (a secret)
    model_host_allowlist: tuple  # NOTEBOOK_MODEL_HOST_ALLOWLIST: networks of local model servers
    llm_timeout: float          # NOTEBOOK_LLM_TIMEOUT: a model call's whole answer, streamed or not
    llm_connect_timeout: float  # NOTEBOOK_LLM_CONNECT_TIMEOUT: connecting to a provider
    context_max_chars: int      # NOTEBOOK_CONTEXT_MAX_CHARS: the most context sent with one question
    espeak_binary: str          # NOTEBOOK_ESPEAK_BINARY: podcasts' local speech engine

    @property
    def uploads_dir(self):
        return os.path.join(self.data_dir, "uploads")

    @property
    def podcasts_dir(self):
        return os.path.join(self.data_dir, "podcasts")

    @property
    def provider_allowlist(self):
        """Networks a credential's base URL may reach despite the SSRF guard."""
        return self.url_allowlist + self.model_host_allowlist

    @property
    def auth_enabled(self):
        return bool(self.password)

    @classmethod
    def from_env(cls, data_dir, serving=True):
        """`serving`: for the web service, which refuses to start without a password;
        the job worker answers no one and does not need it."""
        password = os.environ.get("NOTEBOOK_PASSWORD", "")
        allow_none = env_bool("NOTEBOOK_ALLOW_NO_PASSWORD")
        if serving and not password and not allow_none:
            raise ConfigError("NOTEBOOK_PASSWORD is not set: set it, or NOTEBOOK_ALLOW_NO_PASSWORD=1 "
                              "to run the notebook without authentication")
        chunk_size = env_int("NOTEBOOK_CHUNK_SIZE", 1000, minimum=100, maximum=20000)
        overlap = env_int("NOTEBOOK_CHUNK_OVERLAP", 150, minimum=0, maximum=10000)
        if overlap >= chunk_size // 2:
            raise ConfigError("NOTEBOOK_CHUNK_OVERLAP must be less than half of NOTEBOOK_CHUNK_SIZE")
        provider = env_choice("NOTEBOOK_EMBEDDING_PROVIDER", "local", ("local", "openai", "none"))
        default_model = "all-MiniLM-L6-v2" if provider != "openai" else "text-embedding-3-small"
        embedding_url = env_str("NOTEBOOK_EMBEDDING_URL").rstrip("/")
        if provider == "openai" and not embedding_url.startswith(("http://", "https://")):
            raise ConfigError("NOTEBOOK_EMBEDDING_PROVIDER=openai needs NOTEBOOK_EMBEDDING_URL (http(s)://…/v1)")
        default_ui = os.path.join(os.path.dirname(__file__), "vendor", "node_modules", "swagger-ui-dist")
        return cls(
            data_dir=data_dir,
            database_url=env_str("DATABASE_URL", "sqlite:///" + os.path.join(data_dir, "notebook.db")),
            password=password,
            allow_no_password=allow_none,
            cors_origins=_origins(env_str("NOTEBOOK_CORS_ORIGINS")),
            max_upload_bytes=env_int("NOTEBOOK_MAX_UPLOAD_BYTES", 100 * MB, minimum=1024),
            max_text_bytes=env_int("NOTEBOOK_MAX_TEXT_BYTES", 10 * MB, minimum=1024),
            max_source_chars=env_int("NOTEBOOK_MAX_SOURCE_CHARS", 5_000_000, minimum=1000, maximum=200_000_000),
            max_expansion=env_int("NOTEBOOK_MAX_EXPANSION", 100, minimum=2, maximum=10_000),
            fetch_timeout=env_seconds("NOTEBOOK_FETCH_TIMEOUT", 20.0, maximum=600),
            fetch_max_bytes=env_int("NOTEBOOK_FETCH_MAX_BYTES", 20 * MB, minimum=1024),
            url_allowlist=_networks("NOTEBOOK_URL_ALLOWLIST"),
            chunk_size=chunk_size,
            chunk_overlap=overlap,
            embedding_provider=provider,
            embedding_model=env_str("NOTEBOOK_EMBEDDING_MODEL", default_model),
            embedding_url=embedding_url,
            embedding_api_key=os.environ.get("NOTEBOOK_EMBEDDING_API_KEY", ""),
            sync_timeout=env_seconds("NOTEBOOK_SYNC_TIMEOUT", 300.0, maximum=3600),
            jobs_path=os.path.abspath(env_str("NOTEBOOK_JOBS_DB", os.path.join(data_dir, "jobs.db"))),
            redis_url=env_str("REDIS_URL"),
            worker_threads=env_int("NOTEBOOK_WORKER_THREADS", 1, minimum=1, maximum=32),
            swagger_ui_dir=os.path.abspath(env_str("NOTEBOOK_SWAGGER_UI_DIR", default_ui)),
            encryption_key=_encryption_key(),
            model_host_allowlist=_networks("NOTEBOOK_MODEL_HOST_ALLOWLIST"),
            llm_timeout=env_seconds("NOTEBOOK_LLM_TIMEOUT", 120.0, maximum=3600),
            llm_connect_timeout=env_seconds("NOTEBOOK_LLM_CONNECT_TIMEOUT", 5.0, maximum=120),
            context_max_chars=env_int("NOTEBOOK_CONTEXT_MAX_CHARS", 400_000, minimum=1000, maximum=10_000_000),
            espeak_binary=env_str("NOTEBOOK_ESPEAK_BINARY", "espeak-ng"),
        )
