"""Print every distribution installed in this interpreter's environment as ``name==version``,
sorted, except editable installs (guide_utils itself): what ``requirements.lock`` pins.

Unlike ``pip freeze``, a package installed from a local wheel (Horovod, built by
scripts/setup.sh) is listed by its version, not as ``name @ file:///tmp/...whl``, so the
lock reads the same on every machine.

    .venv/bin/python scripts/freeze.py      # what `make lock` writes
"""

from __future__ import annotations

import json
from importlib import metadata


def _editable(dist: metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    return bool(text) and json.loads(text).get("dir_info", {}).get("editable", False)


def pins() -> list[str]:
    dists = [d for d in metadata.distributions() if d.metadata["Name"]]
    # An editable install's source tree is on sys.path with its build metadata (an .egg-info):
    # the same project a second time, not a pin either.
    editable = {d.metadata["Name"].lower() for d in dists if _editable(d)}
    seen = {}
    for dist in dists:
        name = dist.metadata["Name"]
        if name.lower() not in editable:
            seen.setdefault(name.lower(), f"{name}=={dist.version}")  # first on sys.path wins, as for import
    return sorted(seen.values(), key=str.lower)


if __name__ == "__main__":
    print("\n".join(pins()))
