# The two commands the README documents. Both set up a fresh machine first (scripts/setup.sh:
# Debian packages when root, .venv, pinned packages, the Horovod build); the set-up is a
# no-op when nothing changed.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
export VENV

.PHONY: setup book test clean-book

setup:
	scripts/setup.sh

# Executes every notebook in _toc.yml at laptop scale, then builds _build/html.
# -W -n --keep-going: every Sphinx warning (broken reference, unexecuted notebook) fails it.
book: setup
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# The whole suite: unit, multi-process, notebooks (nbval), the book build.
test: setup
	$(VENV)/bin/python -m pytest tests notebooks --nbval-lax -p no:cacheprovider

clean-book:
	rm -rf _build
