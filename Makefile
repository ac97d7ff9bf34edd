# mqstore build. `make run` and `make test` create .venv/ on first use; later calls reuse it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto')
PB     := services/pb/manifest.json

.PHONY: install run test test-fast test-deps lint bench bench-deps soak clean

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

install: $(STAMP) $(PB)

# pip also builds the record codec's C module (libstore/_codec.c: needs cc, Python.h, zlib.h).
$(STAMP): pyproject.toml libstore/_codec.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	@touch $(STAMP)

# Generated gRPC code (services/pb, not committed): rebuilt whenever a .proto changes.
$(PB): $(STAMP) $(PROTOS) services/_protogen.py
	$(BIN)/python -m services._protogen

run: install
	$(BIN)/mqstore serve

# mypy: libstore strictly, services where they meet untyped gRPC, bench ([tool.mypy] in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The tests run in TEST_WORKERS processes (pytest-xdist), each taking one test file at a time, so
# a file's module-scoped suites start once; most tests wait on processes, disks and timeouts, so
# two workers on two cores cut the wall time by about a third (18.5 -> 12.7 minutes). TEST_WORKERS=0 runs them in this process, in order.
TEST_WORKERS ?= 2
test: lint test-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20

# The inner loop: lint (ruff, mypy) and the unit tests (real files, no servers; under a minute
# on 2 cores).
# `make test` before a commit lands.
test-fast: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/unit

# The election tests (tests/service/test_election.py) start their own etcd members from Debian's
# etcd-server package on 127.0.0.1 (as root, else through sudo); a system etcd it may start is
# not used.
test-deps:
	@command -v etcd >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

bench: install
	$(BIN)/python -m bench --write-readme

# The peers of `python -m bench --suite peers`: Debian's redis-server, nats-server and
# rabbitmq-server (as root, else through sudo) and their Python clients (the bench extra). The
# suite starts its own instances on free 127.0.0.1 ports; any system service Debian starts is not used.
bench-deps: install
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server nats-server rabbitmq-server etcd-server
	$(BIN)/python -m pip install -q -e '.[bench]'

# The fault loop (tests/fault) for hundreds of faults; MQSTORE_FAULT_SEED=<seed> replays a run.
SOAK_ROUNDS ?= 300
soak: install
	MQSTORE_FAULT_ROUNDS=$(SOAK_ROUNDS) $(BIN)/python -m pytest -q -s --timeout=0 tests/fault/test_fault_loop.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis services/pb libstore/*.so
