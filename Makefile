# Two commands on a fresh machine with nothing but Python 3.11:
#   make demo   record 3 episodes in the MuJoCo twin and check them by replay
#   make test   run the whole suite (creates the environment, LeRobot compat extra included)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.hilrec-runtime
TEST_STAMP := $(VENV)/.hilrec-test
DEMO_ROOT ?= demo-data/so101_sim_demo
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
# The dataset stack must never reach for a hub: everything is local.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: demo test bench env test-env clean

$(RUNTIME_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(TEST_STAMP): $(RUNTIME_STAMP) requirements-compat.txt
	$(BIN)/pip install --quiet -r requirements-compat.txt
	$(BIN)/pip install --quiet --no-deps 'lerobot==0.4.4'
	touch $@

env: $(RUNTIME_STAMP)
test-env: $(TEST_STAMP)

demo: $(RUNTIME_STAMP)
	rm -rf $(DEMO_ROOT)
	$(BIN)/hilrec record --sim --root $(DEMO_ROOT) --episodes 3 --seed 0 --cameras front
	$(BIN)/hilrec check $(DEMO_ROOT) --replay
	@echo "demo dataset: $(abspath $(DEMO_ROOT))"

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(TEST_STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) demo-data build *.egg-info
