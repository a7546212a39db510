# The two commands the README documents. Both set up a fresh machine first (scripts/setup.sh:
# Debian packages when root, .venv, the locked packages, the Horovod build), each with what it
# needs and nothing more; the set-up is a no-op when nothing changed.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV ?= .venv
export VENV

.PHONY: setup setup-book book test image lock clean-book

setup:
	scripts/setup.sh

# The book's set-up: the Python stack, Horovod and Chromium; no Slurm, podman or Node.js.
setup-book:
	scripts/setup.sh --for book

# Executes every notebook in _toc.yml at laptop scale (two at a time; unchanged ones come
# from the execution cache, which is emptied when guide_utils or the pins change), then
# builds _build/html strictly: any Sphinx warning fails it. Then reads every page in headless
# Chromium (errors, unresolved references, broken figures, overflowing code) and saves a
# screenshot of each in _build/screenshots; without Chromium that step says so and is skipped.
book: setup-book
	$(VENV)/bin/python scripts/book.py
	$(VENV)/bin/python scripts/browse_book.py _build || [ $$? -eq 3 ]

# The whole suite: unit, doctests, multi-process, real Slurm jobs, the book build (each
# notebook executed once), on every core (pytest-xdist; at most 4 workers: see
# tests/slurm_cluster.py first_job_id). The slowest tests, by wall and by CPU time, are
# listed at the end.
test: setup
	$(VENV)/bin/python -m pytest tests src --doctest-modules -p no:cacheprovider -n auto --maxprocesses=4 --durations=25 --cpu-durations=25 --host-speed

# The guide's OCI image (chapter 15), built with podman as root; reused while its inputs stay
# the same. tests/test_container_image.py builds it too when it is missing.
image: setup
	$(VENV)/bin/python -m guide_utils image build

# Pin every installed distribution after a change to requirements.txt (then commit the lock).
lock:
	{ sed -n '1,3p' requirements.lock; $(VENV)/bin/python scripts/freeze.py; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean-book:
	rm -rf _build
