#!/usr/bin/env bash
# Installs the Debian packages mqproxy's commands need, only where missing.
#   setup-system.sh venv   only what `python3 -m venv` needs (for `make serve`)
#   setup-system.sh        everything the test tiers need: a JDK (Spark, stock RocketMQ, the Java clients)
#                          and Maven to fetch them, Go for the Go clients, Node.js/npm for the JavaScript
#                          clients, mosquitto_pub/mosquitto_sub for the MQTT smoke test, Chromium and
#                          ChromeDriver for the console's browser test (Selenium drives /usr/bin/chromium)
set -euo pipefail
need=()
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if [ "${1:-all}" != venv ]; then
  command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
  command -v mvn >/dev/null 2>&1 || need+=(maven)
  command -v go >/dev/null 2>&1 || need+=(golang-go)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
  command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
fi
if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "installing system packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
