#!/usr/bin/env bash
# Debian packages qjm builds against: liburing and libxxhash headers, a C compiler, pkg-config, and a
# JRE for the Spark tests. Idempotent: apt-get runs only when something is missing.
set -euo pipefail
pkgs=(liburing-dev libxxhash-dev pkg-config gcc g++ make)
command -v java >/dev/null 2>&1 || pkgs+=(default-jre-headless)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
