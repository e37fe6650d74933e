#!/usr/bin/env bash
# Installs the Debian 12 packages tern needs to build and test. Idempotent; run as root.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git libcmocka-dev libpcre2-dev libjansson-dev libmicrohttpd-dev
      libopenblas-dev clang-14 libclang-rt-14-dev curl
      bible-kjv python3-torch)  # bible-kjv: default-model corpus; python3-torch: training golden (scripts/)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
