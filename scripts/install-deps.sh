#!/usr/bin/env bash
# Installs the Debian 12 packages that building and running tern need (compiler, CMake,
# pkg-config and the libraries CMakeLists.txt requires, and libzstd-dev for the prompt cache), plus any package names given as
# arguments (scripts/install-test-deps.sh passes the test-only ones). Idempotent; uses sudo when
# not run as root.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git libpcre2-dev libjansson-dev libmicrohttpd-dev libopenblas-dev libzstd-dev
      "$@")
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
