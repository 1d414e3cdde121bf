#!/usr/bin/env bash
# Installs the peers `sluice bench` compares against: Debian's nats-server, rabbitmq-server, redis-server and
# activemq, and their Python clients (the `bench` extra: nats-py, pika, redis, stomp.py) into .venv.
# Idempotent and quiet when everything is there. Not part of scripts/bootstrap.sh: the test suite skips the peer
# tests when a peer is missing.
#
# The bench starts each peer itself on loopback ports, so no Debian service may stay running: a policy-rc.d that
# refuses every start is in place during the install, and any peer process the install still started is stopped
# by its pid afterwards.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
debs=(nats-server rabbitmq-server redis-server activemq)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Processes of the peers' programs (pid list), to stop only those the install started.
peer_pids() {
  local pid exe
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    case "$exe" in
      */nats-server|*/redis-server|*/epmd|*/beam.smp|*/java)
        # java only when it runs ActiveMQ
        if [[ "$exe" == */java ]] && ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q activemq; then
          continue
        fi
        echo "$pid" ;;
    esac
  done
}

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-peers: installing ${missing[*]} needs root (apt-get)" >&2
    exit 1
  fi
  echo "install-peers: apt-get install ${missing[*]}"
  before="$(peer_pids | sort)"
  added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  trap '[ "$added_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  after="$(peer_pids | sort)"
  for pid in $(comm -13 <(echo "$before") <(echo "$after")); do
    echo "install-peers: stopping pid $pid ($(readlink "/proc/$pid/exe" 2>/dev/null || echo gone)) started by the install"
    kill "$pid" 2>/dev/null || true
  done
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "install-peers: $venv is missing; run scripts/bootstrap.sh first" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import nats, pika, redis, stomp" 2>/dev/null; then
  echo "install-peers: pip install the bench extra (nats-py, pika, redis, stomp.py)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/constraints.txt" \
    nats-py pika redis stomp.py
fi
