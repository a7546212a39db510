#!/usr/bin/env bash
# Horovod's setup.py runs "$HOROVOD_CMAKE <src> <args>" to configure and
# "$HOROVOD_CMAKE --build . <args>" to build. Only the configure call takes the project
# include that fixes the C++ standard; the build call passes through unchanged.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
real_cmake=${GUIDE_REAL_CMAKE:-/usr/bin/cmake}
if [[ "${1:-}" == "--build" ]]; then
    exec "$real_cmake" "$@"
fi
exec "$real_cmake" "$@" "-DCMAKE_PROJECT_INCLUDE=$here/cxx-standard.cmake"
