#!/usr/bin/env bash
# Install the real RocketMQ 5 gRPC clients used by tests/e2e/test_grpc_clients.py (idempotent, quiet).
#
#   .clients/py5/                     venv with PyPI rocketmq-python-client==5.1.2 (grpcio, protobuf, otel)
#   tests/e2e/grpc_node/node_modules/ npm rocketmq-client-nodejs@1.0.8 pinned by package-lock.json
#
# Its own venv: the client pulls grpcio/grpcio-tools/opentelemetry and registers apache.rocketmq.v2 in the
# default protobuf pool, none of which belongs in the proxy's venv. Only PyPI and the npm registry are
# contacted. An existing, working install is left untouched. Set PYTHON to pick the interpreter.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
venv="$root/.clients/py5"
node_dir="$root/tests/e2e/grpc_node"
version="5.1.2"

probe='import importlib.metadata as m, sys; sys.exit(m.version("rocketmq-python-client") != sys.argv[1])'
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$probe" "$version" 2>/dev/null; }; then
    rm -rf "$venv"
    mkdir -p "$root/.clients"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        "rocketmq-python-client==$version"
    "$venv/bin/python" -c "$probe" "$version"
    echo "setup-grpc-clients: installed rocketmq-python-client==$version in ${venv#"$root"/}"
fi

if [ -f "$node_dir/package-lock.json" ]; then
    if command -v npm >/dev/null 2>&1; then
        if ! (cd "$node_dir" && node -e \
            'process.exit(require("rocketmq-client-nodejs/package.json").version === "1.0.8" ? 0 : 1)') 2>/dev/null
        then
            (cd "$node_dir" && npm ci --silent --no-audit --no-fund >/dev/null)
            echo "setup-grpc-clients: installed rocketmq-client-nodejs@1.0.8 in ${node_dir#"$root"/}/node_modules"
        fi
    else
        echo "setup-grpc-clients: npm not found; skipping the Node client (its e2e tests will be skipped)" >&2
    fi
fi
