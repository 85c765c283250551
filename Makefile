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

.PHONY: demo-notice test demo bench bench-reap bench-agent bench-churn deps venv lint typecheck unit coverage-floors proto clean

test: deps venv lint typecheck
	$(BIN)/python -m pytest $(COV_ARGS) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory coverage-floors

demo: demo-notice deps venv
	$(BIN)/python -m tests.harness.lab.demo

# Said before anything is installed: the demo is for a machine to try the reaper on.
demo-notice:
	@echo "make demo: installs Debian packages (containerd, runc, CNI plugins, iptables, nftables, podman, ...)"
	@echo "and runs a private containerd lab. Run it on a test machine, not on a production node."

bench: deps venv
	$(BIN)/python -m bench.scan_bench
	$(BIN)/python -m bench.hostile_memory

bench-reap: deps venv
	$(BIN)/python -m bench.reap_bench

bench-agent: deps venv
	$(BIN)/python -m bench.agent_idle

bench-churn: deps venv
	$(BIN)/python -m bench.churn_bench

# Debian packages: installed only when one is missing, so a warm machine skips apt.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

lint: venv
	$(BIN)/ruff check reaper tests bench
	$(BIN)/ruff format --check reaper tests bench

typecheck: venv
	$(BIN)/mypy reaper tests bench

unit: venv
	$(BIN)/python -m pytest $(COV_ARGS) tests/unit
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
