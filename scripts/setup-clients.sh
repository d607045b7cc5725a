#!/usr/bin/env bash
# Install the real RocketMQ 4.x remoting clients used by tests/e2e (idempotent, quiet).
#
#   .clients/py044/   venv with PyPI rocketmq==0.4.4             (C++ core 1.x, bundled librocketmq.so)
#   .clients/pycvs/   venv with PyPI rocketmq-python-cvs==2.1.0.3 (C++ core 2.1, bundled librocketmq.so)
#   tests/e2e/clients/node_modules/   npm ali-ons@3.12.0 pinned by package-lock.json
#
# Both Python packages import as `rocketmq`, hence one venv each. Only PyPI and the npm registry are
# contacted. An existing, working install is left untouched. Set PYTHON to pick the interpreter.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
clients="$root/.clients"
node_dir="$root/tests/e2e/clients"

install_venv() {  # name, pip requirement
    local venv="$clients/$1" req="$2"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
        return 0
    fi
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$req"
    "$venv/bin/python" -c 'import rocketmq.client'
    echo "setup-clients: installed $req in ${venv#"$root"/}"
}

mkdir -p "$clients"
install_venv py044 "rocketmq==0.4.4"
install_venv pycvs "rocketmq-python-cvs==2.1.0.3"

if command -v npm >/dev/null 2>&1; then
    if ! (cd "$node_dir" && node -e 'process.exit(require("ali-ons/package.json").version === "3.12.0" ? 0 : 1)') 2>/dev/null; then
        (cd "$node_dir" && npm ci --silent --no-audit --no-fund >/dev/null)
        echo "setup-clients: installed ali-ons@3.12.0 in ${node_dir#"$root"/}/node_modules"
    fi
else
    echo "setup-clients: npm not found; skipping ali-ons (its e2e tests will be skipped)" >&2
fi
