# Two commands on a fresh machine with nothing but Python 3.11:
#   make demo   record 3 episodes in the MuJoCo twin and check them by replay
#   make test   lint and types beside the whole suite, benchmarks' smoke runs included (creates
#               the environment, LeRobot compat extra included)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.hilrec-runtime
TEST_STAMP := $(VENV)/.hilrec-test
SYSTEM_STAMP := $(VENV)/.hilrec-system
DEMO_ROOT ?= demo-data/so101_sim_demo
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
# The dataset stack must never reach for a hub: everything is local.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: demo test suite test-fast lint types bench bench-smoke env test-env clean

# The packages go in through uv, from its download cache (~/.cache/uv): pip keeps no cache of
# the index's wheels here, so every clean clone downloaded torch and its CUDA libraries again
# (4-5 minutes); with uv's cache warm the whole test environment takes under a minute. The venv
# keeps pip for people. UV_NATIVE_TLS: the system's certificates, as pip uses them.
UV := $(BIN)/uv
# --compile-bytecode: uv writes no .pyc (pip does), and where PYTHONDONTWRITEBYTECODE is set (this
# machine and CI) no process writes one either, so every process compiled each module it imports:
# 8.6 s of CPU for LeRobot's ACT alone, 3.6 s with the .pyc, in each of the suite's ~1,000
# processes that import hilrec, MuJoCo, torch or LeRobot.
UV_PIP := $(UV) pip install --quiet --compile-bytecode --python $(BIN)/python --constraint constraints.txt
export UV_NATIVE_TLS := 1

$(RUNTIME_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet 'uv>=0.9'
	$(UV_PIP) -e '.[test,rerun]'
	touch $@

$(TEST_STAMP): $(RUNTIME_STAMP) requirements-compat.txt $(SYSTEM_STAMP)
	$(UV_PIP) -r requirements-compat.txt
	$(UV_PIP) --no-deps 'lerobot==0.4.4'
	# robomimic reads back what hilrec export writes; its dataset class needs only torch and h5py.
	$(UV_PIP) --no-deps 'robomimic==0.3.0'
	touch $@

# Debian packages the tests drive for real: Chromium for the web page's browser test (Playwright
# cannot download a browser of its own here). A clean CI machine has none of them.
DEBIAN_PACKAGES := chromium
$(SYSTEM_STAMP): $(RUNTIME_STAMP)
	@missing=""; for pkg in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "ok installed" || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make test needs Debian packages:$$missing (apt-get install$$missing)" >&2; exit 1; fi; \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing; \
	fi
	touch $@

env: $(RUNTIME_STAMP)
test-env: $(TEST_STAMP)

demo: $(RUNTIME_STAMP)
	rm -rf $(DEMO_ROOT)
	$(BIN)/hilrec record --sim --root $(DEMO_ROOT) --episodes 3 --seed 0 --cameras front
	$(BIN)/hilrec check $(DEMO_ROOT) --replay
	@echo "demo dataset: $(abspath $(DEMO_ROOT))"

# pytest-xdist workers. Four fill two cores, because many tests wait on a daemon, an emulator or
# a browser more than they compute (a driver test waits out a silent port's timeout, a collect
# test a killed daemon). Side by side on one commit from clean clones: three workers left the
# cores 11.9 % idle and took 10:26, four 5.5 % and 9:33 (on a slower hour of this machine).
# One test at a time (WORKERS=0, in this process) takes over 20 minutes. Every race with the load
# that the workers found has been mended in the product or the test (a test that a loaded machine
# can fail by chance is a defect). --dist loadgroup keeps each
# xdist_group (tests/conftest.py: tests sharing a built fixture) on one worker;
# tests/test_worker_groups.py fails if the groups stop holding. tests/conftest.py orders the run:
# the modules with a slow test first, the fast ones last, so that no worker ends on a long test alone.
WORKERS ?= 4
pytest_on = $(BIN)/python -m pytest -q -n $(1) --dist loadgroup
PYTEST := $(call pytest_on,$(WORKERS))

# Everything: the suite with the benchmarks' smoke runs inside it (tests/test_bench_smoke.py) and
# the 25 slowest tests named at the end (where the next minute is to be won), with ruff and mypy
# beside it: the suite leaves a core idle whenever its workers all wait on daemons' clocks, and
# mypy's minute of CPU fits there. At nice 19 it takes only what the suite leaves, instead of
# slowing the suite's start, where the workers' collection keeps both cores busy. Lint's output
# follows the suite's; make fails if either failed. `make lint` alone is the quick check.
LINT_LOG := $(VENV)/lint.log
test: $(TEST_STAMP)
	@nice -n 19 $(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory suite; suite=$$?; \
	wait $$lint; linted=$$?; echo "== lint and types (exit $$linted)"; cat $(LINT_LOG); \
	test $$suite = 0 -a $$linted = 0

# The project's own modules compiled first, for the same reason (__pycache__ is ignored by git).
COMPILE := $(BIN)/python -m compileall -q -j 0 daemon drivers sim tests bench

suite: $(TEST_STAMP)
	$(COMPILE)
	$(PYTEST) --durations=25 tests

# The fast tier, for the edit-test loop (2 minutes at most): every package's tests but those
# marked slow (the end-to-end daemons, browsers, LeRobot runs, kill loops, and any test measured
# over a second here), on two workers: its tests share no daemon, so they stay on time side by
# side. Not in .ci/run: CI runs `make test`.
FAST_WORKERS ?= 2
test-fast: $(TEST_STAMP)
	$(COMPILE)
	$(call pytest_on,$(FAST_WORKERS)) --durations=10 -m "not slow" tests

lint: $(RUNTIME_STAMP) types
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy sees the folders under their import names through links (package-dir maps daemon/ to
# hilrec.daemon, which mypy cannot follow in an editable install).
TYPECHECK := build/typecheck/hilrec
types: $(RUNTIME_STAMP)
	mkdir -p $(TYPECHECK) && touch $(TYPECHECK)/__init__.py
	for d in daemon drivers sim; do ln -sfn ../../../$$d $(TYPECHECK)/$$d; done
	$(BIN)/mypy -p hilrec
	$(BIN)/mypy tests bench

# Every benchmark runs to the end, whatever an earlier one said: a benchmark exits non-zero when it
# misses its own target (bench_view_load on a loaded machine), and that is a result to read beside
# the others, not a reason to measure nothing after it. The ones that did are named last, and make
# fails then.
bench: $(TEST_STAMP)
	@failed=""; for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "== exited non-zero:$$failed"; exit 1; fi; echo "== every benchmark exited 0"

# Every benchmark at its smallest size (--smoke), one after another. `make test` runs the same
# smoke runs as tests (tests/test_bench_smoke.py), spread over its workers.
bench-smoke: $(TEST_STAMP)
	for b in bench/bench_*.py; do echo "== $$b --smoke"; $(BIN)/python $$b --smoke || exit 1; done

# LeRobot 0.6.1 on Python 3.13, both ways: it loads what hilrec (host venv) writes, and
# `hilrec check`, installed on 3.13, accepts what it writes. Runs in a Debian trixie root cached
# under build/compat-latest/ and rebuilt when its inputs change (needs root; see the script).
.PHONY: compat-latest
compat-latest: $(RUNTIME_STAMP)
	bash tests/compat_latest/run.sh

clean:
	rm -rf $(VENV) demo-data build *.egg-info
