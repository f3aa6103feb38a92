# trainyard: the two commands are `make demo` and `make test`; everything else is a building block.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
PYTHON      ?= python3
NODES       ?= 3
DATA_MTU    ?= 9000
SIM_NAME    ?= ty
# Test workers: the unit suite and the integration suite (one simulated cluster per worker) run this many at once.
TEST_WORKERS ?= 2
SIM         := $(VENV)/bin/python tests/sim/simcluster.py
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export TORCH_CUDA_ARCH_LIST ?= 9.0

.PHONY: help venv engine images sim-up sim-down demo test lint unit molecule integration bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

venv: $(VENV)/.stamp .cache/llamafactory-site/.stamp ## create .venv/ with the pinned controller toolchain

$(VENV)/.stamp: requirements.txt requirements-ml.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q -r requirements-ml.txt
	@# DeepSpeed ships only as an sdist; without GPU ops it builds as a pure-Python wheel.
	mkdir -p .cache/wheels
	ls .cache/wheels/deepspeed-0.19.8-*.whl >/dev/null 2>&1 || \
	  DS_BUILD_OPS=0 $(VENV)/bin/pip wheel -q --no-deps --no-build-isolation -w .cache/wheels deepspeed==0.19.8
	$(VENV)/bin/pip install -q --no-deps .cache/wheels/deepspeed-0.19.8-*.whl
	touch $@

# LLaMA-Factory's parser for the llamafactory profile's render-time check, beside the venv (requirements file says why).
.cache/llamafactory-site/.stamp: requirements-llamafactory.txt $(VENV)/.stamp
	rm -rf .cache/llamafactory-site
	$(VENV)/bin/pip install -q --no-deps --target .cache/llamafactory-site -r requirements-llamafactory.txt
	touch $@

engine: ## install and start the docker engine and the local registry (no systemd needed)
	$(PYTHON) tests/sim/engine.py ensure

images: venv engine ## build (or reuse) the node and training images and push the training image
	$(SIM) images

sim-up: venv engine ## bring up a simulated cluster: make sim-up NODES=3 DATA_MTU=9000
	$(SIM) up --name $(SIM_NAME) --nodes $(NODES) --data-mtu $(DATA_MTU)

sim-down: ## remove the simulated cluster: containers, networks, volumes
	$(SIM) down --name $(SIM_NAME)

demo: sim-up ## run site.yml on a 3-node simulated cluster and leave it running
	ansible-playbook -i inventory/sim site.yml
	@echo
	@echo "The simulated cluster is still running."
	@echo "  After a crash:  $(VENV)/bin/ansible-playbook -i inventory/sim reset.yml -e reset_confirm=true"
	@echo "  Job status:     $(VENV)/bin/ansible-playbook -i inventory/sim playbooks/status.yml"
	@echo "  Tear it down:   make sim-down"

lint: venv ## yamllint, ansible-lint (production profile) and pyflakes over the product's Python and its tests
	yamllint -s .
	ansible-lint -q --profile production
	pyflakes library action_plugins filter_plugins callback_plugins inventory_plugins strategy_plugins collections roles/*/files tests

unit: venv ## unit and property tests (no cluster needed)
	pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests/unit

molecule: images ## molecule scenarios (docker driver, simulated-node image)
	set -e; for s in $$(ls molecule); do echo "== molecule test -s $$s"; molecule test -s $$s; done

integration: images ## integration tests on simulated clusters
	pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests/integration

test: lint unit molecule integration ## everything CI runs

bench: venv engine ## benchmarks: prints the tables and writes docs/benchmarks.md
	$(VENV)/bin/python tests/bench/run.py
	$(VENV)/bin/python tests/bench/run.py --only scale,userpath --sizes 16,32,64 --userpath-sizes 2,4,8 --repeats 2

clean: sim-down ## remove the simulated cluster and local caches
	rm -rf .cache runs
