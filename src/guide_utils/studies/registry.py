"""The studies, found rather than listed: as a launcher is its class (``runtime.launchers``),
a study is its module.

Every module of ``guide_utils.studies`` that declares ``STUDY``, a
:class:`~guide_utils.studies.study.Study` with its ``help`` line, is a study and a command,
``python -m guide_utils NAME`` (its ``name``): the module's own ``main(argv)`` where it has
one, else the declared study's (``Study.main``, for a study that declares its ``arguments``
and ``plan``). The command table and ``--help`` of ``python -m guide_utils``, and the tests
that check every study, read this registry, so a new study is its module plus its test and
no other file. The modules are imported only when one of these is asked for: the other
commands start without them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from .study import Study

PACKAGE = __name__.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Entry:
    """One registered study: its declaration, the module that declares it and its command's function."""

    study: Study
    module: str
    function: str  # "main", or "STUDY.main" (the declared study's own command)


@functools.cache
def entries() -> dict[str, Entry]:
    """Every study of the package by its name, in the order of their names."""
    found: dict[str, Entry] = {}
    for info in pkgutil.iter_modules(importlib.import_module(PACKAGE).__path__):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        declared = vars(module).get("STUDY")
        if not isinstance(declared, Study):
            continue
        if not declared.help:
            raise TypeError(f"{module.__name__}.STUDY declares no help line: the one line python -m guide_utils "
                            "--help shows for it")
        if declared.name in found:
            raise TypeError(f"two studies named {declared.name!r}: {found[declared.name].module} and "
                            f"{module.__name__}")
        function = "main" if callable(vars(module).get("main")) else "STUDY.main"
        found[declared.name] = Entry(declared, module.__name__, function)
    return dict(sorted(found.items()))


def studies() -> dict[str, Study]:
    """Every study's declaration by its name."""
    return {name: entry.study for name, entry in entries().items()}


def commands() -> dict[str, tuple[str, str]]:
    """``python -m guide_utils``'s table of the studies: name -> (module, function)."""
    return {name: (entry.module, entry.function) for name, entry in entries().items()}


def help_lines() -> list[str]:
    """The studies' lines of ``python -m guide_utils --help``."""
    return [f"  {name:<13} {entry.study.help}" for name, entry in entries().items()]
