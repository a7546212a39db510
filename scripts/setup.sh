#!/usr/bin/env bash
# Sets up everything the guide needs, idempotently: Debian packages (when root), the
# virtual environment, the pinned Python packages, guide_utils (editable) and Horovod 0.28.1
# built with PyTorch + TensorFlow + Gloo + MPI. Re-running it when nothing changed takes
# seconds: each step checks before it acts.
#
#   scripts/setup.sh              # what `make test` runs first: everything the tests use
#   scripts/setup.sh --for book   # what `make book` runs first: only what the book needs
#   VENV=/path/to/venv scripts/setup.sh
#
# The guide's OCI image is not built here: `make image` builds it, and so does the one test
# module that runs it (tests/test_container_image.py), reusing it while its inputs stay the same.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

# Absolute: the Horovod build runs CMake from its own directory.
VENV=$(realpath -m "${VENV:-$repo/.venv}")
# The interpreter, when PYTHON does not name one: python3.11 on PATH, else the distribution's.
# Not the distribution's first, although Debian builds it with PGO and LTO and a pyenv build
# without --enable-optimizations is slower (torch's import took 14 % and a smoke training 9 %
# more CPU under pyenv's 3.11.7 than under Debian's 3.11.2 on the 2-core CI machine): under
# Debian's, 2 of 6 fresh-clone CI runs lost rank 0 of an srun --mpi=pmix Horovod job to a
# segmentation fault at start-up (a call through a null pointer), against none in 15 runs
# under pyenv's (docs/setup.md). PYTHON=/usr/bin/python3.11 chooses it anyway.
PYTHON_CANDIDATES=(python3.11 /usr/bin/python3.11)
HOROVOD_VERSION=0.28.1
# What a set-up is for: "test" (the default) installs everything the tests use; "book" only
# what executing the notebooks and reading the built pages needs, so that a reader who wants
# the book does not wait for Slurm, podman or Node.js.
purpose=test
case "${1:-}" in
    "") ;;
    --for) purpose=${2:-}; [[ $purpose == book || $purpose == test ]] || {
        printf '[setup] error: --for takes book or test, not "%s"\n' "$purpose" >&2; exit 2; } ;;
    *) printf '[setup] error: unknown option "%s"; use scripts/setup.sh [--for book|test]\n' "$1" >&2; exit 2 ;;
esac
# Debian packages for the book: OpenMPI (mpirun + mpicc/headers for Horovod's MPI controller,
# which chapters 3 and 14 run), CMake < 4 (Horovod's bundled gloo declares an old
# cmake_minimum_required), a C++ compiler, and Chromium with its WebDriver, in which
# `make book` reads every page of the built book.
APT_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make chromium chromium-driver)
# The distribution's Python, when the venv is to use it (above), needs its venv module and,
# for Horovod's build, its headers.
[[ -x /usr/bin/python3.11 && $(command -v "${PYTHON:-${PYTHON_CANDIDATES[0]}}") == /usr/bin/python3.11 ]] &&
    APT_PACKAGES+=(python3.11-venv libpython3.11-dev)
# For the tests as well: the ShellCheck linter for the sbatch examples, Slurm + munge, which
# the tests start as a two-node cluster on this machine to run every sbatch example; podman
# with runc and mmdebstrap, which build and run the guide's OCI image
# (containers/Containerfile; Debian 12 has no Apptainer); nftables and python3-apt, for the
# Ansible playbook's tests.
[[ $purpose == test ]] && APT_PACKAGES+=(shellcheck slurm-wlm munge podman runc mmdebstrap nftables python3-apt)

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
# set -e ends the script silently; say which command failed instead.
trap 'printf "[setup] error: line %s failed: %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

# --- Debian packages ---------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        say "installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        say "missing Debian packages (tests that need them will skip). Install them with:"
        say "  sudo apt-get install -y ${missing[*]}"
    fi
fi

# Node.js and npm, for JupyterHub's proxy (below): Debian's, unless a node that brings its
# own npm (NodeSource's) is already installed (Debian's npm package would conflict with it).
if [[ $purpose == test ]] && ! command -v npm >/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        say "installing Debian packages: nodejs npm"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    else
        say "npm not found (the JupyterHub test will skip). Install it with: sudo apt-get install -y nodejs npm"
    fi
fi

# --- virtual environment -----------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    if [[ -n ${PYTHON:-} ]]; then
        command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON=/path/to/python3.11"
        say "creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV"
    else
        # A candidate that cannot make a venv (Debian without python3.11-venv), or older than
        # 3.11.2 (Ubuntu 22.04's is a 3.11.0 release candidate), is passed over.
        for PYTHON in "${PYTHON_CANDIDATES[@]}" ""; do
            [[ -n $PYTHON ]] || die "no python3.11 (3.11.2 or newer) that can create a venv; install python3.11-venv or set PYTHON=/path/to/python3.11"
            command -v "$PYTHON" >/dev/null || continue
            "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11, 2))' 2>/dev/null || continue
            if "$PYTHON" -m venv "$VENV" 2>/dev/null; then
                say "created $VENV with $PYTHON ($("$PYTHON" -V 2>&1))"
                break
            fi
            rm -rf "$VENV"
        done
    fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Some machines list local package mirrors that do not exist for every package; pip warns
# once per package. Those lines are noise here; errors still show and still fail.
pip_install() {
    "${pip[@]}" install -q "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
}

# --- pinned packages (re-installed only when requirements.txt or the lock changes) ---
# requirements.txt names what the guide needs; requirements.lock pins every distribution
# (dependencies of dependencies too) and constrains every install below.
# uv installs them: pip unpacks the 7 GB (torch's CUDA libraries) one file at a time, about
# 2.5 min on two cores even with every wheel cached; uv downloads in parallel and links
# files from its cache (~/.cache/uv), 10 s when the cache has them. It reads no pip.conf:
# a site mirror is given with UV_INDEX_URL (and UV_NATIVE_TLS=1 for a site's own CA).
stamp="$VENV/.requirements.sha256"
excluded=scripts/excluded-packages.txt
want=$(sha256sum requirements.txt requirements.lock pyproject.toml "$excluded" | sha256sum | cut -d' ' -f1)
if [[ ! -f "$stamp" || $(cat "$stamp") != "$want" ]]; then
    say "installing the locked packages (~1 min; longer while uv's cache is empty)"
    pip_install -c requirements.lock uv
    # Bytecode, as pip compiles it: without it every process compiles what it imports, each
    # time where PYTHONDONTWRITEBYTECODE is set (CI machines often set it): seconds per import.
    # Compiling all 21,000 modules takes ~40 s on two cores, in every fresh clone. uv links
    # the same files from its cache into every venv (hardlinks: same size and time), so the
    # bytecode compiled for the first venv with these pins is kept and linked into the next.
    # A .pyc records its source's size and time: where a sample does not match (a venv on
    # another file system, where uv copies), compileall recompiles what differs.
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    bytecode="${GUIDE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guide_utils}/bytecode/$want-$("$VENV/bin/python" -c 'import sys; print(sys.implementation.cache_tag)')"
    compile=(--compile-bytecode)
    [[ -d $bytecode ]] && compile=()
    uv=("$VENV/bin/uv" pip install --quiet "${compile[@]}" --python "$VENV/bin/python" -c requirements.lock)
    "${uv[@]}" pip setuptools wheel  # pip: Horovod's build below; setuptools, wheel: editable installs
    "${uv[@]}" -r requirements.txt --excludes "$excluded"
    mapfile -t unwanted < <(grep -v '^#' "$excluded" | grep .)
    "$VENV/bin/uv" pip uninstall --quiet --python "$VENV/bin/python" "${unwanted[@]}" 2>/dev/null || true
    "${uv[@]}" --no-deps -e .
    if [[ -d $bytecode ]]; then
        cp -al -n "$bytecode/." "$site/" 2>/dev/null || cp -a -n "$bytecode/." "$site/" || true
        if "$VENV/bin/python" "$repo/scripts/pyc_matches.py" torch tensorflow numpy pandas; then
            say "bytecode linked from $bytecode"
        else  # exit status 1 for a few of torch's test files written for Python 3.12, as under uv
            "$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
            say "bytecode from $bytecode, recompiled where it did not match its source"
        fi
    else  # kept for the next venv: written beside, then renamed (another set-up may race)
        tmp="$bytecode.$$"
        if mkdir -p "$tmp" && (cd "$site" && find . -path '*/__pycache__/*.pyc' -exec cp -l --parents -t "$tmp" {} +) \
            && mv -T "$tmp" "$bytecode" 2>/dev/null; then
            say "bytecode kept in $bytecode for the next venv"
        fi
        rm -rf "$tmp"
    fi
    echo "$want" >"$stamp"
fi

# --- Horovod 0.28.1 --------------------------------------------------------------------
# Horovod's last release predates current PyTorch: built from source with the fixes in
# scripts/horovod/ (C++ standard, CMake version, CUDA toolkit location).
want_frameworks=(PyTorch TensorFlow Gloo)
with_mpi=0
if command -v mpicc >/dev/null; then with_mpi=1; want_frameworks+=(MPI); fi

horovod_ok() {
    local out
    out=$(TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>/dev/null) || return 1
    grep -q "Horovod v$HOROVOD_VERSION" <<<"$out" || return 1
    for fw in "${want_frameworks[@]}"; do
        grep -Eq "\[X\] $fw\$" <<<"$out" || return 1
    done
}

# The check imports torch and TensorFlow (~20 s): a set-up that changes nothing skips it when
# neither the pinned packages nor the installed Horovod changed since it last passed.
checked="$VENV/.horovod-checked"
horovod_key() {
    { cat "$stamp"; echo "$HOROVOD_VERSION ${want_frameworks[*]}"
      cat "$VENV"/lib/python3*/site-packages/horovod-*.dist-info/RECORD 2>/dev/null; } | sha256sum | cut -d' ' -f1
}
if [[ -f "$checked" && $(cat "$checked") == "$(horovod_key)" ]]; then
    say "Horovod $HOROVOD_VERSION already built with ${want_frameworks[*]} (checked at an earlier set-up)"
elif horovod_ok; then
    say "Horovod $HOROVOD_VERSION already built with ${want_frameworks[*]}"
else
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    build_env=(
        HOROVOD_CMAKE="$repo/scripts/horovod/cmake-wrapper.sh"
        GUIDE_REAL_CMAKE="$(command -v cmake || echo /usr/bin/cmake)"
        CMAKE_POLICY_VERSION_MINIMUM=3.5
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
        HOROVOD_WITH_GLOO=1 MAKEFLAGS="-j$(nproc)"
    )
    if ((with_mpi)); then build_env+=(HOROVOD_WITH_MPI=1); else build_env+=(HOROVOD_WITHOUT_MPI=1); fi
    # PyTorch wheels built for CUDA make Horovod's CMake look for a CUDA toolkit even when
    # no GPU operations are built. The toolkit pip installed beside torch has what it needs;
    # point CMake at it through a small directory of links.
    cu=$(find "$site/nvidia" -maxdepth 1 -name 'cu[0-9]*' -type d 2>/dev/null | sort | tail -n 1)
    if [[ -n "$cu" && -f "$cu/include/cuda_runtime_api.h" ]]; then
        shim="$VENV/cuda-toolkit-shim"
        mkdir -p "$shim/lib64"
        ln -sfn "$cu/include" "$shim/include"
        cudart=$(find "$cu/lib" -name 'libcudart.so*' | sort | head -n 1)
        ln -sfn "$cudart" "$shim/lib64/libcudart.so"
        build_env+=(CUDAToolkit_ROOT="$shim" CUDA_HOME="$shim")
    fi
    log="$VENV/horovod-build.log"
    # The compiled wheel is kept, keyed by everything the build depends on, so another clone
    # on this machine installs it in seconds (pip caches wheels the same way; its own cache
    # cannot be used here because the build depends on environment variables it ignores).
    torch_tf=$("$VENV/bin/python" -c 'import torch, tensorflow as tf; print(torch.__version__, tf.__version__)' 2>/dev/null || true)
    flags="${build_env[*]}" && flags=${flags//$VENV/} && flags=${flags//$repo/}  # the same in every clone
    key=$(printf '%s\n' "$HOROVOD_VERSION" "$torch_tf" "$("$VENV/bin/python" -V)" "$flags" \
          "$(cat scripts/horovod/* | sha256sum)" "$(mpicc --showme:version 2>/dev/null || true)" | sha256sum | cut -c1-16)
    wheels="${GUIDE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guide_utils}/wheels/horovod-$key"
    # No cache yet on a fresh machine: find fails, which is not an error here.
    wheel=$(find "$wheels" -name 'horovod-*.whl' 2>/dev/null | head -n 1 || true)
    # A cached wheel passed the full check when it was built (below), under the same key: not
    # checked again here (the check imports torch and TensorFlow, ~20 s of every fresh set-up).
    if [[ -n "$wheel" ]] && "${pip[@]}" install --no-deps -q "$wheel" >"$log" 2>&1 \
        && "$VENV/bin/python" -c 'import horovod' 2>>"$log"; then
        say "Horovod $HOROVOD_VERSION installed from the wheel built earlier ($wheel)"
    else
        say "building Horovod $HOROVOD_VERSION with ${want_frameworks[*]} (~7 min on 2 cores)"
        build=$(mktemp -d)
        if ! env "${build_env[@]}" "${pip[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -v \
            -w "$build" "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            die "Horovod build failed; full log: $log"
        fi
        pip_install -c requirements.lock "$build"/horovod-*.whl
        horovod_ok || { "$VENV/bin/horovodrun" --check-build >&2 || true; die "Horovod built but lacks one of: ${want_frameworks[*]}"; }
        { mkdir -p "$wheels" && mv "$build"/horovod-*.whl "$wheels"/; } 2>/dev/null || say "could not keep the wheel in $wheels (no cache: the next clone builds again)"
        rm -rf "$build"
        say "Horovod $HOROVOD_VERSION built; log: $log"
    fi
fi
horovod_key >"$checked"

# --- JupyterHub's proxy ---------------------------------------------------------------
# configurable-http-proxy (npm) into the venv: its bin/ beside jupyterhub, which finds it on
# PATH (tests/test_jupyterhub.py). 5.1.0 runs on Node.js 18 and newer (5.2 needs 20, and the
# dependencies of 5.3 need 22.12).
CHP_VERSION=5.1.0
if [[ $purpose == test && $("$VENV/bin/configurable-http-proxy" --version 2>/dev/null) != "$CHP_VERSION" ]]; then
    if command -v npm >/dev/null; then
        say "installing configurable-http-proxy $CHP_VERSION (npm) into $VENV"
        npm install --global --prefix "$VENV" --no-audit --no-fund --loglevel=error \
            "configurable-http-proxy@$CHP_VERSION" >/dev/null
    else
        say "npm not found: configurable-http-proxy not installed (the JupyterHub test will skip)"
    fi
fi

# The Jupyter kernel the notebooks name ("python3") must be this venv's Python.
if [[ ! -f "$VENV/share/jupyter/kernels/python3/kernel.json" ]]; then
    "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
fi
say "ready: $VENV"
