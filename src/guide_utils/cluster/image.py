"""The guide's OCI image (``containers/Containerfile``), built and run with podman on this
machine: ``python -m guide_utils image build|smoke|save``.

* ``build``: the base image (Debian 12 from Debian's archive by ``mmdebstrap``: no registry
  needed), then the image, tagged by a hash of what it is made of (the lock counts only by
  the pins of what the image installs): an image built from the same inputs is reused, and
  says so. Two tags: ``localhost/guide-env:HASH`` (Python, Open
  MPI and the venv from ``requirements.lock``: minutes, once per lock) and
  ``localhost/guide:HASH`` (that plus ``src/``: seconds).
* ``smoke``: one smoke epoch inside the image, its record read back on the host.
* ``save``: the image as a docker-archive, which Apptainer converts
  (``apptainer build guide.sif docker-archive://guide.tar``).

The Horovod in the image is the wheel ``scripts/setup.sh`` compiled for the venv (cp311, the
lock's torch): the same build, installed in seconds instead of compiled again.

The image has no NCCL network plugin and no libfabric built for HPE Slingshot: on a cluster it
runs under Apptainer through a site profile, which binds the host's (``GUIDE_APPTAINER_NET_LIBS``;
``lib/guide.sh``); without them, on Slingshot, the job's doctor says that NCCL would use TCP.

How podman is called (its flags on a machine like the CI VM, its errors): :mod:`.podman`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from packaging.utils import canonicalize_name

from ..core.cli import ArgumentParser, one_line_errors
from ..core.errors import GuideError
from ..core.paths import repo_root
from .podman import (executable, exists, global_flags, image_id, image_size, last_line, podman, run,
                     run_flags)

PROG = "guide_utils image"
BASE = "localhost/guide-base:bookworm"
ENV_REPO = "localhost/guide-env"
REPO = "localhost/guide"
SUITE = "bookworm"
HOROVOD = "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
# What the build's context holds, from the repository (the Horovod wheel is added to it).
CONTEXT_FILES = ("containers/Containerfile", "containers/requirements-runtime.txt", "requirements.lock")
# Where the host's HTTPS certificate authorities are (a site proxy's own CA among them).
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements or lock file, by normalised name."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name)] = version.strip()
    return out


def base_image(say: Callable[[str], None] = print) -> str:
    """The base image: Debian 12 (minbase) from Debian's archive, made once by mmdebstrap and
    imported; reused when present."""
    if exists(BASE):
        return BASE
    if shutil.which("mmdebstrap") is None:
        raise GuideError(f"no {BASE} and no mmdebstrap to make it: apt-get install mmdebstrap")
    say(f"making the base image {BASE} from Debian's archive (mmdebstrap --variant=minbase {SUITE}, ~20 s)")
    with tempfile.TemporaryDirectory(prefix="guide-base-") as tmp:
        tar = Path(tmp, "base.tar")
        proc = subprocess.run(["mmdebstrap", "--variant=minbase", "--quiet", SUITE, str(tar)],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise GuideError(f"mmdebstrap failed: {last_line(proc.stderr)}")
        podman("import", "--quiet", str(tar), BASE)
    return BASE


def can_run() -> str | None:
    """None when podman can start a container here, else why not (podman's own last line)."""
    try:
        base = base_image(say=lambda _: None)
        proc = podman("run", "--rm", *run_flags(), base, "true", check=False, timeout=120)
    except GuideError as exc:
        return str(exc)
    return None if proc.returncode == 0 else f"podman run failed: {last_line(proc.stderr)}"


def horovod_wheel(cache: Path | None = None) -> Path:
    """The Horovod wheel scripts/setup.sh compiled and kept (its cache, keyed on what the build
    depends on): the one whose compiled PyTorch library is the installed one, else the newest."""
    cache = cache or Path(os.environ.get("GUIDE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                                 or Path.home() / ".cache") / "guide_utils")
    wheels = sorted(cache.glob(f"wheels/horovod-*/{HOROVOD}"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not wheels:
        raise GuideError(f"no Horovod wheel in {cache}/wheels: run scripts/setup.sh first (it builds and keeps one)")
    installed = _installed_record_line()
    for wheel in wheels:
        if installed and installed in _wheel_record(wheel):
            return wheel
    return wheels[0]


def _installed_record_line() -> str | None:
    from importlib import metadata
    try:
        record = metadata.distribution("horovod").read_text("RECORD") or ""
    except metadata.PackageNotFoundError:
        return None
    return next((ln for ln in record.splitlines() if re.match(r"horovod/torch/mpi_lib_v2.*\.so,", ln)), None)


def _wheel_record(wheel: Path) -> str:
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        return z.read(name).decode()


def _digest(paths: dict[str, Path], *extra: str) -> str:
    """sha256 over the names and contents of ``paths`` (files or folders) and ``extra``."""
    h = hashlib.sha256()
    for name, path in sorted(paths.items()):
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for f in files:
            h.update(f"{name}/{f.relative_to(path) if f != path else ''}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    for e in extra:
        h.update(e.encode() + b"\0")
    return h.hexdigest()[:16]


def _context(root: Path, wheel: Path, into: Path) -> None:
    """The build context: the Containerfile, the pins, the wheel and guide_utils' sources."""
    for rel in CONTEXT_FILES:
        shutil.copy2(root / rel, into / Path(rel).name)
    (into / "wheels").mkdir()
    shutil.copy2(wheel, into / "wheels" / wheel.name)
    shutil.copytree(root / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))


def runtime_pins(root: Path) -> dict[str, str] | None:
    """The lock's pins of what ``containers/requirements-runtime.txt`` installs: its packages
    and their dependencies, recursively, extras included, as the venv's own metadata states
    them (the venv was made from the same lock). None where the venv lacks one of them."""
    from importlib import metadata

    from packaging.requirements import Requirement
    lock = pins(root / "requirements.lock")
    todo: list[tuple[str, frozenset]] = [(name, frozenset()) for name in pins(root / CONTEXT_FILES[1])]
    seen: dict[str, set] = {}
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            return None
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name: lock.get(name, "") for name in sorted(seen)}


def tags(root: Path, wheel: Path, base_id: str) -> tuple[str, str]:
    """The environment's and the image's tags: hashes of what each is made of. Of the lock,
    only the pins the image installs count (:func:`runtime_pins`): a new pin for a test or
    book package does not rebuild the image (the whole lock when the venv cannot say)."""
    closure = runtime_pins(root)
    files = {Path(rel).name: root / rel for rel in CONTEXT_FILES if closure is None or rel != "requirements.lock"}
    env = _digest(files | {"wheel": wheel}, base_id, json.dumps(closure))
    return f"{ENV_REPO}:{env}", f"{REPO}:{_digest({'src': root / 'src'}, env)}"


def _build(context: Path, tag: str, args: list[str], say: Callable[[str], None], log: Path) -> None:
    """``podman build`` with one progress line per step (the full output goes to ``log``)."""
    mounts = []
    uv_cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
    if uv_cache.is_dir():  # overlay (:O): the build reads the host's cache, its writes are dropped
        mounts += ["-v", f"{uv_cache}:/root/.cache/uv:O"]
    ca = next((c for c in CA_BUNDLES if Path(c).is_file()), None)
    if ca:
        mounts += ["-v", f"{ca}:/etc/ssl/host-ca.crt:ro"]
    cmd = [executable(), *global_flags(), "build", *global_flags(), *run_flags(), "--pull=never", *mounts, *args,
           "-t", tag, str(context)]
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            m = re.match(r"(\[\d+/\d+\] )?STEP \d+/\d+: (RUN|COPY)\b(.*)", line)
            if m:
                say(f"  {time.monotonic() - start:5.0f} s  {m.group(1) or ''}{m.group(2)}{m.group(3)[:70]}")
        if proc.wait() != 0:
            lines = log.read_text().splitlines()
            raise GuideError(f"podman build of {tag} failed: {last_line(chr(10).join(lines[-20:]))} (log: {log})")


def build(root: Path | None = None, say: Callable[[str], None] = print, log_dir: Path | None = None) -> dict:
    """Build the image, or reuse the one built from the same inputs. Returns its tag, whether
    it was reused, and the seconds the two builds took."""
    root = root or repo_root()
    executable()  # "not found" as it is, not as a reason it cannot run
    begun = time.monotonic()
    had_base = exists(BASE)
    reason = can_run()
    if reason:
        raise GuideError(f"podman cannot run containers here: {reason}")
    wheel = horovod_wheel()
    env_tag, tag = tags(root, wheel, image_id(BASE))
    result = {"tag": tag, "env_tag": env_tag, "reused": True, "seconds": 0.0, "env_seconds": 0.0,
              "base_seconds": 0.0 if had_base else round(time.monotonic() - begun, 1)}
    if exists(tag):
        say(f"reusing {tag} (built earlier from the same lock, Containerfile, Horovod wheel and src/)")
        result["wall_seconds"] = round(time.monotonic() - begun, 1)
        return result
    result["reused"] = False
    log_dir = log_dir or Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="guide-image-") as tmp:
        context = Path(tmp)
        _context(root, wheel, context)
        if exists(env_tag):
            say(f"reusing {env_tag} (Python, Open MPI and the venv from the same lock)")
        else:
            say(f"building {env_tag}: Debian's Python and Open MPI, the venv from requirements.lock "
                "(~6 min on 2 cores)")
            start = time.monotonic()
            _build(context, env_tag, ["--target", "runtime", "--build-arg", f"BASE={BASE}"], say,
                   log_dir / "guide-env-build.log")
            result["env_seconds"] = round(time.monotonic() - start, 1)
        say(f"building {tag}: guide_utils' sources on top")
        start = time.monotonic()
        _build(context, tag, ["--target", "guide", "--build-arg", f"ENV_IMAGE={env_tag}"], say,
               log_dir / "guide-image-build.log")
        result["seconds"] = round(time.monotonic() - start, 1)
    _untag_others(tag, env_tag)
    result["wall_seconds"] = round(time.monotonic() - begun, 1)
    say(f"built {tag} ({image_size(tag) / 1e9:.2f} GB) in {time.monotonic() - begun:.0f} s")
    return result


def _untag_others(*keep: str) -> None:
    """Older tags of the two repositories go (their layers stay while another image uses them)."""
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
    old = [t for t in out if t.split(":")[0] in (REPO, ENV_REPO) and t not in keep]
    if old:
        podman("rmi", *old, check=False)


SMOKE = ["python", "-m", "guide_utils.train", "--profile", "smoke", "--epochs", "1", "--no-progress",
         "--results-dir", "/results"]


def smoke(tag: str, results: Path) -> dict:
    """One smoke epoch in the image; the run's record, read on the host, and its wall time."""
    results.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = run(tag, SMOKE, results)
    wall = round(time.monotonic() - start, 1)
    if proc.returncode != 0:
        raise GuideError(f"the smoke epoch in {tag} failed: {last_line(proc.stderr)}")
    records = sorted(results.glob("*.jsonl"))
    if len(records) != 1:
        raise GuideError(f"the smoke epoch in {tag} wrote {len(records)} records in {results}, not one")
    rows = [json.loads(line) for line in records[0].read_text().splitlines()]
    epochs = [r for r in rows if r["type"] == "epoch"]
    return {"wall_seconds": wall, "epochs": len(epochs), "record": str(records[0]), **{
        k: epochs[-1][k] for k in ("seconds", "loss", "val_top1_err", "images_per_second") if k in epochs[-1]}}


def save(tag: str, out: Path) -> Path:
    """``tag`` as a docker-archive at ``out``: what ``apptainer build guide.sif docker-archive://OUT``
    converts where Apptainer runs. An existing ``out`` is refused (podman would replace it)."""
    if out.exists():
        raise GuideError(f"{out} exists; remove it or choose another file for the archive")
    podman("save", "--format", "docker-archive", "-o", str(out), tag, timeout=1800)
    return out


RECORDED = ("results", "recorded", "container_image.jsonl")


def recorded() -> dict:
    """What was measured on the guide's CI machine (``smoke --record`` and ``save --record``
    into ``results/recorded/container_image.jsonl``): ``first`` (a build from an empty podman
    store, and one smoke epoch), ``again`` (the same lock again: the environment reused, only
    the sources' layer built, since the record itself is in them) and ``saved`` (the
    docker-archive)."""
    from ..core.paths import packaged
    rows = [json.loads(line) for line in packaged(*RECORDED).read_text().splitlines() if line.strip()]
    builds = [r for r in rows if "build" in r]
    return {"first": next(r for r in builds if not r["build"]["reused"] and r["build"]["base_seconds"]),
            "again": next(r for r in builds if not r["build"]["env_seconds"] and not r["build"]["base_seconds"]),
            "saved": next(r for r in rows if "save" in r)}


def parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="build the image, or reuse the one built from the same inputs")
    s = sub.add_parser("smoke", help="build or reuse, then train one smoke epoch inside the image")
    s.add_argument("--results-dir", default=None, help="where the run's record goes (default: a temporary folder)")
    s.add_argument("--record", default=None, help="also append what was measured to this file, as one JSON line")
    v = sub.add_parser("save", help="build or reuse, then write the image as a docker-archive (for Apptainer)")
    v.add_argument("output", help="the archive to write, e.g. guide.tar")
    v.add_argument("--record", default=None,
                   help="also append its size and the time it took to this file, as one JSON line")
    return p


def _commit() -> str:
    """The repository's commit (12 digits), with a note when the work tree has changes."""
    git = ["git", "-C", str(repo_root())]
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _append(path: Path, line: dict) -> None:
    """One JSON line more in ``path``, with the date."""
    with path.open("a") as f:
        f.write(json.dumps({"date": time.strftime("%Y-%m-%d"), **line}) + "\n")


def say(line: str) -> None:
    print(f"[image] {line}", flush=True)


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.action == "save" and Path(args.output).exists():  # before minutes of building, not after
        raise GuideError(f"{args.output} exists; remove it or choose another file for the archive")
    built = build(say=say)
    print(built["tag"])
    if args.action == "smoke":
        with tempfile.TemporaryDirectory(prefix="guide-image-smoke-") as tmp:
            measured = smoke(built["tag"], Path(args.results_dir or tmp))
        say(f"one smoke epoch inside {built['tag']}: {measured['epochs']} epoch, val top-1 error "
            f"{measured['val_top1_err']:.1f}%, {measured['wall_seconds']} s in all")
        if args.record:
            from ..results.plots import hardware_label
            line = {"machine": hardware_label(), "image": built["tag"], "size_bytes": image_size(built["tag"]),
                    "build": built,
                    "smoke": {k: v for k, v in measured.items() if k != "record"},
                    "podman": podman("--version").stdout.strip(),
                    "load_average_15min": round(os.getloadavg()[2], 1),  # other work on the machine
                    "commit": _commit()}
            _append(Path(args.record), line)
    elif args.action == "save":
        start = time.monotonic()
        out = save(built["tag"], Path(args.output))
        if args.record:
            _append(Path(args.record), {"image": built["tag"], "save": {
                "seconds": round(time.monotonic() - start, 1), "bytes": out.stat().st_size}})
        say(f"wrote {out} ({out.stat().st_size / 1e9:.2f} GB); where Apptainer runs: "
            f"apptainer build guide.sif docker-archive://{out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
