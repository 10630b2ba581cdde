#!/usr/bin/env bash
# Debian packages qjm builds against: liburing and libxxhash headers, a C compiler, pkg-config, and a
# JRE for the Spark tests; and the peers `qjm bench --peers` compares against (bench/peers/):
# zookeeper (3.8, the server jars only: not zookeeperd), etcd-server (3.4) and nats-server (2.9), about
# 10 s more to install; and the Prometheus server (2.42) the metrics tests scrape the nodes with. None of
# them may run as a service: the harness starts its own clusters on free
# loopback ports, so their postinst scripts are denied starting anything (a temporary policy-rc.d) and
# their units are disabled where systemd runs. Idempotent: apt-get runs only when something is missing.
set -euo pipefail
pkgs=(liburing-dev libxxhash-dev pkg-config gcc g++ make zookeeper etcd-server nats-server prometheus)
command -v java >/dev/null 2>&1 || pkgs+=(default-jre-headless)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing Debian packages: ${missing[*]}"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd.service nats-server.service prometheus.service \
      prometheus-node-exporter.service >/dev/null 2>&1 || true
  fi
fi
