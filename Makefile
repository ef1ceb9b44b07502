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
	$(PY) -m bench.wizard

setup: system-deps $(VENV)/.installed

system-deps:
	@bash devtools/system-deps.sh

# Reinstalled whenever requirements.txt changes.
$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
