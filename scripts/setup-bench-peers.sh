#!/usr/bin/env bash
# Install the peer brokers bench/mqtt.py compares mqproxy with (idempotent, quiet).
#
#   mosquitto          Debian package `mosquitto` (the broker binary only is used; the packaged system
#                      service is stopped and disabled so nothing listens on a public interface;
#                      bench/mqtt.py runs its own instance bound to 127.0.0.1 with a generated config)
#   .clients/amqtt/    venv with PyPI amqtt==0.12.1 (the version docs/spec measured)
#
# Only the Debian mirrors and PyPI are contacted. An existing, working install is left untouched.
# Needs root (or sudo) for apt-get. Set PYTHON to pick the interpreter for the amqtt venv.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
venv="$root/.clients/amqtt"
amqtt_version="0.12.1"

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    # policy-rc.d exit 101 keeps dpkg from starting the packaged service during the install.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        created_policy=1
    fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mosquitto >/dev/null \
        || { $sudo apt-get update -q >/dev/null && \
             $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mosquitto >/dev/null; }
    if [ "$created_policy" -eq 1 ]; then $sudo rm -f "$policy"; fi
    echo "setup-bench-peers: installed Debian mosquitto $(dpkg-query -W -f='${Version}' mosquitto)"
fi
# Never leave the packaged service running (it would listen on port 1883 of every interface).
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now mosquitto >/dev/null 2>&1 || true
fi
if command -v service >/dev/null 2>&1; then
    $sudo service mosquitto stop >/dev/null 2>&1 || true
fi

probe='import importlib.metadata as m, sys; sys.exit(m.version("amqtt") != sys.argv[1])'
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$probe" "$amqtt_version" 2>/dev/null; }; then
    rm -rf "$venv"
    mkdir -p "$root/.clients"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "amqtt==$amqtt_version"
    "$venv/bin/python" -c "$probe" "$amqtt_version"
    echo "setup-bench-peers: installed amqtt==$amqtt_version in ${venv#"$root"/}"
fi
