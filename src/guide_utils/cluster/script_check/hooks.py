"""Two ways the probe reaches into code it does not own: wrapping a function or method in
place, and patching a module right after it is imported."""

from __future__ import annotations

import importlib.abc
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` once ``name`` has been imported (Horovod is imported by the
    script, if at all, and only then can its functions be wrapped)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                run, patch = spec.loader.exec_module, self.patch
                spec.loader.exec_module = lambda module: (run(module), patch(module))
                return spec
        return None


def wrap(holder, name: str, before=None, after=None, result=None) -> None:
    """Replace ``holder.name`` by a function that calls ``before(*args)`` first, then the
    original, then ``after(*args)``, and returns ``result(value, *args)`` if given."""
    original = getattr(holder, name)

    def wrapper(*args, **kwargs):
        if before is not None:
            before(*args, **kwargs)
        value = original(*args, **kwargs)
        if after is not None:
            after(*args, **kwargs)
        return result(value, *args, **kwargs) if result is not None else value

    wrapper.__wrapped__ = original
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapper, attr, getattr(original, attr, None))
    setattr(holder, name, wrapper)
