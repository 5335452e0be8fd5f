# raftlog — every target bootstraps .venv itself, so a fresh clone needs nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SEEDS ?= 2000
PYTEST_ARGS ?=

.PHONY: cluster test test-all bench profile sim jepsen jepsen-txn compat compatdeps lint sysdeps clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	@touch $(STAMP)

# System packages the tests use: kcat (a stock Kafka client), a JRE for Spark, and
# nftables/iproute2 for the fault-injection harness. Installed only when missing.
sysdeps:
	@missing=""; \
	command -v kcat >/dev/null || missing="$$missing kcat"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing (run as root or install them)"; \
	  fi; \
	fi

cluster: $(STAMP)
	$(VENV)/bin/raftlog cluster up

test: $(STAMP) sysdeps
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP) sysdeps
	$(PY) -m pytest -q $(PYTEST_ARGS)

sim: $(STAMP)
	RAFTLOG_SIM_SEEDS=$(SEEDS) RAFTLOG_SIM_MEMBERSHIP_SEEDS=$(SEEDS) $(PY) -m pytest -q tests/sim $(PYTEST_ARGS)

bench: $(STAMP) sysdeps
	@for b in storage quorum replication fetch quotas spark security transactions failover; do \
	  if [ -f benchmarks/$$b.py ]; then echo "== benchmarks.$$b"; $(PY) -m benchmarks.$$b || exit 1; fi; \
	done

profile: $(STAMP)
	$(PY) -m benchmarks.produce_profile

jepsen: $(STAMP) sysdeps
	$(PY) -m jepsen matrix

jepsen-txn: $(STAMP) sysdeps
	$(PY) -m jepsen matrix --workload txn

# What building librdkafka's test suite needs (`make compat` only): npm fetches it, a C/C++
# toolchain and OpenSSL/zlib headers build it (RapidJSON: the tests that check JSON stats).
compatdeps:
	@missing=""; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v make >/dev/null || missing="$$missing make"; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	test -f /usr/include/openssl/ssl.h || missing="$$missing libssl-dev"; \
	test -f /usr/include/zlib.h || missing="$$missing zlib1g-dev"; \
	test -d /usr/include/rapidjson || missing="$$missing rapidjson-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing (run as root or install them)"; \
	  fi; \
	fi

# librdkafka's own broker-facing tests against local clusters; the table goes to
# docs/compat.md. Long (about an hour): not part of `make test`.
compat: $(STAMP) compatdeps
	$(PY) -m compat run $(COMPAT_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .raftlog
