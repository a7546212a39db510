"""Exit 0 when each named package's ``__init__`` bytecode matches its source (the size and
modification time a .pyc records), else 1. Imports none of them. Used by setup.sh."""

import importlib.util
import os
import sys


def matches(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(importlib.util.cache_from_source(spec.origin), "rb") as f:
            header = f.read(16)
    except OSError:
        return False
    st = os.stat(spec.origin)
    return (header[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(header[4:8], "little") == 0
            and int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)


if __name__ == "__main__":
    sys.exit(0 if all(matches(name) for name in sys.argv[1:]) else 1)
