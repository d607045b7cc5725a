# The two commands a newcomer needs (see README):
#   make serve   - install mqproxy into .venv and run it on the embedded store (127.0.0.1:9876)
#   make test    - install everything the tests need (Java for Spark, the real third-party clients)
#                  and run every test tier
# `make test-fast` runs only the quick default tier.

PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
PIP       := $(BIN)/pip
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST:= $(VENV)/.installed-test
CONSTRAINTS := constraints.txt

.PHONY: serve test test-fast system-deps clients dashboard-png bench bench-vs-rocketmq bench-cluster fuzz kill9 clean

$(BIN)/python:
	@bash scripts/setup-system.sh venv
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP_RUN): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	touch $@

$(STAMP_TEST): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[test,etl]'
	touch $(STAMP_RUN) $@

serve: $(STAMP_RUN)
	$(BIN)/mqproxy serve --config config/mqproxy.toml

system-deps:
	@bash scripts/setup-system.sh

clients: system-deps
	@bash scripts/setup-clients.sh
	@if [ -f scripts/setup-grpc-clients.sh ]; then bash scripts/setup-grpc-clients.sh; fi
	@if [ -f scripts/setup-mqtt-node.sh ]; then bash scripts/setup-mqtt-node.sh; fi
	@$(PY) scripts/stock_rocketmq.py fetch >/dev/null
	@$(PY) scripts/go_drivers.py build >/dev/null
	@$(PY) scripts/prometheus_server.py build >/dev/null

test: system-deps $(STAMP_TEST) clients
	$(BIN)/python -m pytest -m "" -q -p no:cacheprovider

test-fast: $(STAMP_TEST)
	$(BIN)/python -m pytest -q

# docs/dashboard.png: the Grafana dashboard's queries on a stock Prometheus, 60 s of load on a live proxy
dashboard-png: $(STAMP_TEST) clients
	$(BIN)/python scripts/render_dashboard.py --seconds 60 --out docs/dashboard.png

bench: $(STAMP_TEST)
	$(BIN)/python bench/negotiation.py
	$(BIN)/python bench/store.py
	$(BIN)/python bench/disk_bytes.py
	$(BIN)/python bench/append_cpu.py
	@bash scripts/setup-bench-peers.sh
	$(BIN)/python bench/cpu.py
	$(BIN)/python bench/mqtt_idle.py
	$(BIN)/python bench/mqtt_codec.py

# The reliability campaign (README "Reliability"): 10^6 fuzz inputs per codec (MQFUZZ_INPUTS), and
# 100 kill -9 iterations under load per flush policy
fuzz: $(STAMP_TEST)
	$(BIN)/python -m mqproxy.fuzz

kill9: $(STAMP_TEST)
	$(BIN)/python bench/kill9.py --iterations 100

# mqproxy vs a stock Apache RocketMQ 5.3.3 in the same run (Java 17 and Maven jars; about 10 minutes)
bench-vs-rocketmq: system-deps $(STAMP_TEST)
	$(BIN)/python bench/vs_rocketmq.py --flush async,sync

# mqproxy cluster nodes vs RocketMQ's proxy vs direct, one stock cluster, same run (Java 17, Maven jars)
bench-cluster: system-deps $(STAMP_TEST)
	$(BIN)/python bench/cluster.py

clean:
	rm -rf $(VENV) .clients .cache
