"""Where the guide's files are, found one way everywhere.

Two kinds of files, two answers:

- what ships inside the package (``results/recorded/``, ``results/source_data/``) is read
  through :func:`packaged`, with ``importlib.resources``: it works from a clone, an editable
  install and a wheel alike;
- the repository's own folders (``slurm_examples/``, its site profiles, ``containers/``)
  are not in a wheel. :func:`repo_root` is ``$GUIDE_ROOT`` when set, else the checkout this
  package was imported from; with neither it raises one line saying to set ``GUIDE_ROOT``.

>>> packaged("results", "source_data", "thesis_table_01.csv").is_file()
True
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from .errors import GuideError

PACKAGE = "guide_utils"
# The file that makes a folder the guide's repository: the sbatch examples' library, which
# every site profile, interactive engine and container job sources.
MARKER = Path("slurm_examples", "lib", "guide.sh")


def packaged(*parts: str) -> Traversable:
    """A file or folder shipped inside the package, ``parts`` relative to ``guide_utils/``."""
    return resources.files(PACKAGE).joinpath(*parts)


def package_dir() -> Path:
    """The folder of the ``guide_utils`` package on disk (a wheel's or a clone's ``src/guide_utils``)."""
    return Path(str(resources.files(PACKAGE))).resolve()


def import_root() -> Path:
    """The folder that holds ``guide_utils``: what a child process needs on its PYTHONPATH
    to import this same copy of the package."""
    return package_dir().parent


def pythonpath() -> str:
    """PYTHONPATH for a child process that must import this same copy of ``guide_utils``
    (installed or not): :func:`import_root` first, then the caller's PYTHONPATH."""
    return os.pathsep.join(p for p in (str(import_root()), os.environ.get("PYTHONPATH", "")) if p)


def _checkout(start: Path) -> Path | None:
    """The nearest folder above ``start`` that holds the repository's marker."""
    return next((d for d in start.parents if (d / MARKER).is_file()), None)


def repo_root(start: Path | None = None) -> Path:
    """The guide's repository: ``$GUIDE_ROOT``, else the checkout above ``start`` (default:
    this package's folder). A GuideError when neither is one, e.g. under a wheel install."""
    env = os.environ.get("GUIDE_ROOT")
    if env:
        root = Path(env)
        if not (root / MARKER).is_file():
            raise GuideError(f"GUIDE_ROOT={env} has no {MARKER}; set GUIDE_ROOT to a clone of the guide's repository")
        return root
    root = _checkout(start or package_dir())
    if root is None:
        raise GuideError(f"guide_utils at {start or package_dir()} is not inside the guide's repository "
                         f"(no {MARKER} above it); set GUIDE_ROOT to a clone of the repository, or run from one")
    return root


def repo_path(*parts: str) -> Path:
    """A path inside the guide's repository (see :func:`repo_root`)."""
    return repo_root().joinpath(*parts)
