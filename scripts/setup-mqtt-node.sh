#!/usr/bin/env bash
# Install MQTT.js for tests/e2e/test_mqtt_js_clients.py (idempotent, quiet).
#
#   tests/e2e/mqtt_node/node_modules/  npm mqtt@5.16.0 pinned by package-lock.json
#
# Only the npm registry is contacted, through `npm ci`. An existing install of the pinned version is left
# untouched. Without npm the script says so and exits 0 (the tests then skip).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
node_dir="$root/tests/e2e/mqtt_node"
version="5.16.0"

if ! command -v npm >/dev/null 2>&1; then
    echo "setup-mqtt-node: npm not found; skipping MQTT.js (its e2e tests will be skipped)" >&2
    exit 0
fi
if ! (cd "$node_dir" && node -e \
    'process.exit(require("mqtt/package.json").version === process.argv[1] ? 0 : 1)' "$version") 2>/dev/null
then
    (cd "$node_dir" && npm ci --silent --no-audit --no-fund >/dev/null)
    echo "setup-mqtt-node: installed mqtt@$version in ${node_dir#"$root"/}/node_modules"
fi
