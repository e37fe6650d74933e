#!/usr/bin/env bash
# Installs the build into a temp prefix and builds the example against it twice: through
# pkg-config and through the CMake package (find_package(tern)); then runs it.
# usage: install_test.sh BUILD_DIR SOURCE_DIR MODEL
set -eu
B=$1 S=$2 MODEL=$3
P=$(mktemp -d)
trap 'rm -rf "$P"' EXIT
cmake --install "$B" --prefix "$P/usr" >/dev/null
export PKG_CONFIG_PATH="$P/usr/lib/pkgconfig:$P/usr/lib/x86_64-linux-gnu/pkgconfig"
cc "$S/examples/simple.c" $(pkg-config --cflags --libs tern) -Wl,-rpath,"$P/usr/lib" -o "$P/simple_pc"
"$P/simple_pc" "$MODEL" "once upon a time" 4 | grep -q "^once upon a time"
mkdir -p "$P/proj"
cat > "$P/proj/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(uses_tern C)
find_package(tern REQUIRED)
add_executable(simple $S/examples/simple.c)
target_link_libraries(simple PRIVATE tern::tern)
CM
cmake -S "$P/proj" -B "$P/proj/build" -DCMAKE_PREFIX_PATH="$P/usr" >/dev/null
cmake --build "$P/proj/build" >/dev/null
LD_LIBRARY_PATH="$P/usr/lib" "$P/proj/build/simple" "$MODEL" "once upon a time" 4 | grep -q "^once upon a time"
echo "1 passed, 0 failed"
