# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Python 3.12: from PATH first (a pyenv shim on PATH only counts if it runs), then from pyenv's installed versions.
PY312 := $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	(command -v pyenv >/dev/null && PYENV_VERSION=$$(pyenv versions --bare | grep -E '^3\.12' | tail -n 1) pyenv which python3.12 2>/dev/null))

export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test demo bench clean

$(PYTHON):
	@if [ -z "$(PY312)" ]; then echo "Python 3.12 not found on PATH or through pyenv; install it (pyenv install 3.12)"; exit 1; fi
	$(PY312) -m venv $(VENV)

# openpi-client (openpi's own robot client, which the serving tests drive `vla serve` with) is installed without its
# dependencies: its numpy<2 pin conflicts with lerobot's numpy>=2, and it runs on numpy 2.
# gym-aloha is installed without its dependencies too (dm-control<1.1 and mujoco<3.9 conflict with our mujoco 3.16):
# only its MJCF models and meshes are used (vla/sim/aloha_env.py loads them with mujoco), never its code.
# plugin/ is the LeRobot plugin (a distribution named lerobot_policy_vla), so that the stock lerobot-train/-eval/-record
# find --policy.type=vla.
$(STAMP): $(PYTHON) pyproject.toml plugin/pyproject.toml
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	$(PYTHON) -m pip install --quiet --no-deps 'openpi-client==0.1.2'
	$(PYTHON) -m pip install --quiet --no-deps 'gym-aloha==0.1.5'
	$(PYTHON) -m pip install --quiet --no-deps -e plugin
	touch $(STAMP)

setup: $(STAMP)

# ruff (configured in pyproject.toml) checks the formatting and the lint rules first: a change that fails them fails CI.
test: setup
	$(VENV)/bin/ruff format --check --quiet . || (echo "formatting differs: run $(VENV)/bin/ruff format ."; exit 1)
	$(VENV)/bin/ruff check --quiet .
	$(PYTHON) -m pytest -q

demo: setup
	$(VENV)/bin/vla demo

bench: setup
	OMP_NUM_THREADS=1 $(PYTHON) scripts/bench_tokenizers.py --out results/bench_tokenizers.json

clean:
	rm -rf $(VENV) build dist .pytest_cache
