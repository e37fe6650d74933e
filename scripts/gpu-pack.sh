#!/usr/bin/env bash
# Prepares, on a machine without a GPU, everything scripts/gpu-check.sh needs on a bare GPU machine
# that has the CUDA toolkit (its driver, cuBLAS, python3) but not tern's Debian libraries, so that a
# GPU loan of minutes is one command:
#   builds tern and test_cuda with the CUDA backend (Hopper machine code by default, no MPI) in BUILD,
#   and writes PACK/pack.tar.xz — bin/tern, bin/test_cuda, lib/ (the shared libraries they load
#   beyond glibc's, the C++ runtime's and CUDA's), shared/models/stories260K (test_cuda's real
#   model); about 14 MB, where a loan's working tree may carry 64 MiB — and PACK/run.sh, which
#   unpacks it (python3's tarfile: no xz needed there), puts lib/ on LD_LIBRARY_PATH and runs
#   gpu-check.sh with these binaries.
#
# usage: scripts/gpu-pack.sh [PACK]        (PACK defaults to gpu-pack/, which git ignores)
#   BUILD      the CUDA build folder (default build-gpu/, also ignored)
#   CUDA_ARCH  CMAKE_CUDA_ARCHITECTURES (default 90-real: H100 / H200)
#   TERN_SHARED_DIR  where models/stories260K is (default ../shared)
# then, on the GPU machine, from the repository root (PACK travels as an ignored path):
#   GPU_CHECK_BUDGET=540 bash gpu-pack/run.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=${1:-gpu-pack}
BUILD=${BUILD:-build-gpu}
ARCH=${CUDA_ARCH:-90-real}
SHARED=${TERN_SHARED_DIR:-../shared}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
    echo "gpu-pack: no CUDA compiler (nvcc) here: install the CUDA toolkit" >&2
    exit 1
}
command -v xz >/dev/null || {
    echo "gpu-pack: no xz here (apt-get install xz-utils)" >&2
    exit 1
}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON -DTERN_MPI=OFF -DTERN_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target tern test_cuda
TC="$BUILD/tests/cuda/test_cuda"
if [ ! -x "$BUILD/tern" ] || [ ! -x "$TC" ]; then
    echo "gpu-pack: the build left no $BUILD/tern or $TC" >&2
    exit 1
fi

tmp="$PACK.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
f="$tmp/files"
mkdir -p "$f/bin" "$f/lib" "$f/shared/models"
cp "$BUILD/tern" "$TC" "$f/bin/"
deps=$(ldd "$BUILD/tern" "$TC")
if grep -q 'not found' <<<"$deps"; then
    echo "gpu-pack: a library the binaries need is not found here:" >&2
    grep 'not found' <<<"$deps" >&2
    exit 1
fi
# the libraries the binaries load, except those every Linux with the CUDA toolkit has
awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$deps" | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libgcc_s.so* | libstdc++.so*) ;;
    libcuda.so* | libcudart.so* | libcublas*.so*) ;;
    *) cp -L "$lib" "$f/lib/" ;;
    esac
done
if [ -d "$SHARED/models/stories260K" ]; then
    cp -r "$SHARED/models/stories260K" "$f/shared/models/"
else
    echo "gpu-pack: $SHARED/models/stories260K not found: test_cuda will skip its stories260K check" >&2
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
echo "$commit" >"$f/commit"
tar -C "$f" -cf - . | xz -T"$(nproc)" -6 >"$tmp/pack.tar.xz"
rm -rf "$f"
cat >"$tmp/run.sh" <<'EOF'
#!/usr/bin/env bash
# unpacks pack.tar.xz (made by scripts/gpu-pack.sh) and runs scripts/gpu-check.sh OUT with its binaries
P=$(cd "$(dirname "$0")" && pwd)
U=$(mktemp -d /tmp/tern-pack.XXXXXX)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$P/pack.tar.xz" "$U" || exit 1
chmod +x "$U/bin/"*
export LD_LIBRARY_PATH="$U/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TERN_BIN="$U/bin/tern" TERN_TEST_CUDA="$U/bin/test_cuda" TERN_SHARED_DIR="$U/shared"
echo "tern $(cat "$U/commit") from $P/pack.tar.xz"
R=$P
while [ "$R" != / ] && [ ! -f "$R/scripts/gpu-check.sh" ]; do R=$(dirname "$R"); done
[ -f "$R/scripts/gpu-check.sh" ] || {
    echo "run.sh: no scripts/gpu-check.sh above $P" >&2
    exit 1
}
exec bash "$R/scripts/gpu-check.sh" "$@"
EOF
rm -rf "$PACK"
mv "$tmp" "$PACK"
trap - EXIT
echo "gpu-pack: $PACK ready ($(du -sh "$PACK" | cut -f1), tern $commit); on the GPU machine: bash $PACK/run.sh OUT"
