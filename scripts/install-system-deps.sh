#!/usr/bin/env bash
# The Debian packages qjm needs, in two sets:
#   install-system-deps.sh build   what building qjm needs: `make demo` (and `make wheel`)
#   install-system-deps.sh test    that, and what the test suite and `qjm bench --peers` start
#                                  (the default)
# Idempotent: apt-get runs only when a package is missing.
set -euo pipefail
what=${1:-test}
case "$what" in
  build | test) ;;
  *) echo "usage: $0 [build|test]" >&2; exit 2 ;;
esac

# --- build: a C compiler and pkg-config, the liburing, libxxhash and libssl headers the Cython
# extensions link, and for Debian's own python3 its headers and venv module (the Makefile installs into a
# virtualenv in the checkout: Debian's system pip refuses installs, PEP 668).
build_pkgs=(liburing-dev libxxhash-dev libssl-dev pkg-config gcc g++ make python3-dev python3-venv)

# --- test: a JRE for the Spark tests; iproute2 for the tests that put nodes in network namespaces;
# the peers `qjm bench --peers` compares against (bench/peers/): zookeeper (3.8, the server jars
# only: not zookeeperd), etcd-server (3.4) and nats-server (2.9); the Prometheus server (2.42) the
# metrics tests scrape the nodes with. None of these may run as a service: the harness starts its
# own servers on free loopback ports, so their postinst scripts are denied starting anything (a
# temporary policy-rc.d) and their units are disabled where systemd runs (test_services).
test_pkgs=(iproute2 zookeeper etcd-server nats-server prometheus)
command -v java >/dev/null 2>&1 || test_pkgs+=(default-jre-headless)
test_services=(etcd.service nats-server.service prometheus.service prometheus-node-exporter.service)

pkgs=("${build_pkgs[@]}")
[ "$what" = build ] || pkgs+=("${test_pkgs[@]}")
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
((${#missing[@]})) || exit 0

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
if [ "$what" = test ] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now "${test_services[@]}" >/dev/null 2>&1 || true
fi
