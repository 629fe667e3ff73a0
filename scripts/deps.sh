#!/usr/bin/env bash
# Installs the Debian packages floe builds against (idempotent; needs root or sudo on a fresh machine).
set -euo pipefail
pkgs=(cmake make gcc clang libcjson-dev liburing-dev libmicrohttpd-dev pkg-config libpcre2-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
