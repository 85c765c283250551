# cni-reaper: `make demo` runs a scan against a self-contained lab; `make test` installs
# everything (Debian packages, a virtualenv, the package) and runs every check and test.
# Both need root on a Debian 12 / Ubuntu machine: the lab runs a real containerd.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEB_PACKAGES := containerd runc containernetworking-plugins iptables nftables iproute2 \
	util-linux gcc libc6-dev iputils-ping procps ca-certificates prometheus prometheus-node-exporter systemd podman busybox-static \
	debootstrap systemd-container shellcheck
PYTEST_ARGS ?=
# Line coverage each group of the reclaim path keeps (issue 24), by the unit tests alone and by
# the whole suite: "files:percent", checked after pytest by `coverage report --fail-under`.
COVERAGE_FLOORS := reaper/reap/*:85 reaper/agent.py:80 reaper/metrics.py:80 reaper/report.py:80
COV_ARGS := --cov=reaper --cov-report=term-missing:skip-covered

# The Python packages, every one pinned with its hashes (uv pip compile, see DEVELOPMENT.md):
# test.lock is what make venv installs, runtime.lock what the image and the systemd install do,
# build.lock the build backend the project's own wheel is built with.
LOCKS := requirements/test.lock requirements/runtime.lock requirements/build.lock
UV_COMPILE = $(BIN)/uv pip compile --universal --python-version 3.11 --generate-hashes --quiet

.PHONY: demo-notice test check node-tests demo bench bench-reap bench-agent bench-churn deps venv lock lint typecheck unit coverage-floors proto clean

# The fast checks first (lint, types, unit tests: no root, no Debian package), then the Debian
# packages and the root-only node and packaging tests, then the coverage floors of the whole run.
test: check
	$(MAKE) --no-print-directory deps
	$(MAKE) --no-print-directory node-tests
	$(MAKE) --no-print-directory coverage-floors

# What a contributor without root runs: ruff, mypy --strict and the unit tests.
check: venv lint typecheck
	$(BIN)/python -m pytest $(COV_ARGS) tests/unit

node-tests: venv
	$(BIN)/python -m pytest $(COV_ARGS) --cov-append tests/node tests/packaging $(PYTEST_ARGS)

demo: demo-notice deps venv
	$(BIN)/python -m tests.harness.lab.demo

# Said before anything is installed: the demo is for a machine to try the reaper on.
demo-notice:
	@echo "make demo: installs Debian packages (containerd, runc, CNI plugins, iptables, nftables, podman, ...)"
	@echo "and runs a private containerd lab. Run it on a test machine, not on a production node."

bench: deps venv
	$(BIN)/python -m bench.scan_bench
	$(BIN)/python -m bench.hostile_memory
	$(BIN)/python -m bench.cache_scale

bench-reap: deps venv
	$(BIN)/python -m bench.reap_bench

bench-agent: deps venv
	$(BIN)/python -m bench.agent_idle

bench-churn: deps venv
	$(BIN)/python -m bench.churn_bench

# Debian packages: installed only when one is missing, so a warm machine skips apt. npm (the
# Renovate schema's fetch) by its command: a machine with Node.js from elsewhere keeps its own.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; } || \
	    { echo "make deps: could not install the Debian packages:$$missing (needs root and apt; see DEVELOPMENT.md)"; exit 1; }; \
	fi

venv: $(VENV)/.installed

# Rebuilt whole when the lock changes: a warm machine runs what a fresh one does. pip checks
# every hash and that every dependency is in the lock; the project itself is built with the
# locked setuptools (no build isolation, which would take whatever the index serves).
$(VENV)/.installed: requirements/test.lock
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  { echo "make venv: $(PYTHON) cannot make a virtualenv (Debian: apt-get install python3-venv)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r requirements/test.lock
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# Refresh the lock: the newest releases pyproject.toml's ranges admit, for every platform the
# image is built for, with hashes. test.lock first; the others are held to its versions.
lock: venv
	$(UV_COMPILE) pyproject.toml requirements/build.in --extra test -o requirements/test.lock --upgrade
	$(UV_COMPILE) pyproject.toml -c requirements/test.lock -o requirements/runtime.lock
	$(UV_COMPILE) requirements/build.in -c requirements/test.lock -o requirements/build.lock

lint: venv
	$(BIN)/ruff check reaper tests bench
	$(BIN)/ruff format --check reaper tests bench

typecheck: venv
	$(BIN)/mypy reaper tests bench

unit: check
	$(MAKE) --no-print-directory coverage-floors

# Fails when a group's line coverage, in the .coverage the last pytest run wrote, is under its floor.
coverage-floors:
	@for floor in $(COVERAGE_FLOORS); do \
	  files=$${floor%:*}; percent=$${floor##*:}; \
	  got=$$($(BIN)/coverage report --include="$$files" --format=total) || exit 1; \
	  echo "coverage of $$files: $$got% (floor $$percent%)"; \
	  $(BIN)/coverage report --include="$$files" --fail-under=$$percent >/dev/null || \
	    { echo "coverage of $$files is under $$percent%"; exit 1; }; \
	done

# Regenerate the CRI protobuf messages after editing a .proto: the reaper's own
# (reaper/runtime/api.proto) and the lab's (tests/harness/cri/api.proto).
proto: venv
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. reaper/runtime/api.proto tests/harness/cri/api.proto

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .coverage
