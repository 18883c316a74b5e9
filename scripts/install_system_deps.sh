#!/usr/bin/env bash
# System packages some of the harness's own tests need, installed on demand by those
# tests (tests/system_packages.py) and never by the main job: a private sshd and an ssh
# client for the two-namespace lab, iproute2 for namespaces/veth/tc, and Prometheus with
# node_exporter for the Prometheus-source test. With arguments, only those packages.
# Idempotent and quiet: when everything is present it returns in well under a second
# without touching apt. The packages' own services are never used (the tests start
# private copies by hand), so none is enabled or started.
#
#   bash scripts/install_system_deps.sh                 # all of them
#   bash scripts/install_system_deps.sh prometheus      # just these
set -euo pipefail

if [ "$#" -gt 0 ]; then
    PKGS=("$@")
else
    PKGS=(openssh-server openssh-client iproute2 prometheus prometheus-node-exporter)
fi

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: apt-get not found; install by hand: ${missing[*]}" >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 keeps dpkg from starting the packages' services during install
# (in a container without systemd they would fail; on a host we do not want them).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
    "${SUDO[@]}" chmod +x "$policy"
    made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then "${SUDO[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT
"${SUDO[@]}" apt-get update -qq >/dev/null
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    2> >(grep -v "^debconf: delaying" >&2)
# Installing a package with a service enables it on a systemd host (policy-rc.d only
# keeps it from starting now). The tests never use these services: switch off the ones
# this script just installed, so no sshd or Prometheus appears after the next boot.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    for p in "${missing[@]}"; do
        case "$p" in
            openssh-server) unit=ssh.service ;;
            prometheus) unit=prometheus.service ;;
            prometheus-node-exporter) unit=prometheus-node-exporter.service ;;
            *) continue ;;
        esac
        "${SUDO[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
fi
echo "install_system_deps: installed ${missing[*]}"
