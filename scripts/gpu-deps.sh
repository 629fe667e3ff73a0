#!/usr/bin/env bash
# Run HERE (a machine with apt and a network): downloads, without installing, the Debian packages
# floe's build links against into .debs/ at the repository root, for the GPU machine, which can
# reach no network. scripts/gpu-test.sh unpacks them there. Not gnutls: the GPU image has its own.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libcjson1 libcjson-dev libmicrohttpd12 libmicrohttpd-dev liburing2 liburing-dev libpcre2-8-0 libpcre2-dev)
mkdir -p .debs
cd .debs
missing=()
for p in "${pkgs[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}"
fi
ls -1 *.deb
