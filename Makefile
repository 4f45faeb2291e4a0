# mqfed: `make demo` and `make test` are the two commands a newcomer runs.
# Everything they need is installed by `make install` (idempotent).

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
APT_PACKAGES := mosquitto mosquitto-dev libmosquitto-dev mosquitto-clients libcjson-dev \
	etcd-server etcd-client haproxy valgrind gcc make python3-venv openjdk-17-jre-headless openssl \
	debootstrap docker-compose chromium prometheus $(if $(shell command -v dockerd),,docker.io)
# docker.io only where no Docker engine is installed (it conflicts with Docker CE's packages)
DEMO_NODES ?= 3
DEMO_PORT ?= 1883
PYTEST_ARGS ?=

.PHONY: install apt venv proto plugin demo test lint fuzz clean images mutants

install: apt venv proto plugin

apt:
	@missing=$$(for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing Debian packages:" $$missing; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		else \
			echo "Missing Debian packages. Run as root:"; \
			echo "  sudo apt-get update && sudo apt-get install -y $$missing"; \
			exit 1; \
		fi; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,pipeline]'
	@touch $@

venv: $(VENV)/.installed

PROTOS := $(wildcard proto/*.proto)
PROTO_OUT := $(patsubst proto/%.proto,sidecar/_proto/%_pb2.py,$(PROTOS))

proto: $(PROTO_OUT)

$(PROTO_OUT) &: $(PROTOS) sidecar/protogen.py $(VENV)/.installed
	$(VENV)/bin/python -m sidecar.protogen

plugin:
	$(MAKE) -s -C deploy/mosquitto-plugin

demo: install
	$(VENV)/bin/mqfed up --nodes $(DEMO_NODES) --base-port $(DEMO_PORT)

lint: venv
	$(VENV)/bin/ruff check .

# the plugin under AddressSanitizer and UBSan: its regression corpus, then FUZZ_SECONDS (30) of
# mutated inputs (deploy/mosquitto-plugin/fuzz; docs/testing.md)
fuzz:
	$(MAKE) -s -C deploy/mosquitto-plugin fuzz

# with-engine.sh: starts dockerd if needed (and stops it after, only if it started it), builds
# the container images, and announces loudly when the container tests cannot run
test: install lint fuzz
	deploy/docker/with-engine.sh $(VENV)/bin/pytest -q $(PYTEST_ARGS)

# issue 23: break the code on purpose (13 mutations), check the named tests fail; not in `test`
mutants: install
	$(VENV)/bin/python deploy/ci/mutants.py $(MUTANTS_ARGS)

images: install
	deploy/docker/build.sh

clean:
	$(MAKE) -s -C deploy/mosquitto-plugin clean
	rm -f sidecar/_proto/*_pb2*.py sidecar/_proto/*_pb2.pyi
	rm -rf $(VENV) run .pytest_cache .hypothesis
