#!/usr/bin/env bash
# Builds tern (release) and runs the whole test suite with CTest; then, unless TERN_NO_SANITIZE=1,
# builds again with ASan+UBSan and runs the suite there too. Prints CTest's summary lines.
# First installs the build and test packages (scripts/install-test-deps.sh; skip with TERN_NO_DEPS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
[ "${TERN_NO_DEPS:-0}" = 1 ] || bash scripts/install-test-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTERN_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$JOBS"
status=0
(cd build && ctest --output-on-failure -j"$JOBS") || status=1
if [ "${TERN_NO_SANITIZE:-0}" != 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_SANITIZE=ON -DTERN_BUILD_TESTS=ON >/dev/null
  cmake --build build-asan -j"$JOBS"
  (cd build-asan && ctest --output-on-failure -j"$JOBS" -LE slow) || status=1
fi
exit $status
