#!/usr/bin/env bash
# Installs the system packages the test tiers need, only where missing (Debian 12): a Java runtime for
# Spark, Node.js/npm for the JavaScript clients, and mosquitto_pub/mosquitto_sub for the MQTT smoke test.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "installing system packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
