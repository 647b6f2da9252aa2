"""What a test needs from outside the repository, by name, and the one way a test skips for want of it.

`need(NAME, reason)` skips with the reason, or fails where FACEGATE_REQUIRE_<NAME>=1 says this
machine must have it. `.ci/run` sets every flag below, so no test can skip silently in CI:
docs/testing.md lists them with the tests they guard, and tests/test_requirements.py keeps that
list, `.ci/run` and the suite in step (no `pytest.skip` or `importorskip` outside this module)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

NEEDS = {
    "TEST_DATA": "FACEGATE_TEST_DATA: LFW (lfw/pairs.txt, lfw/<person>/*.jpg) and the test photos (tests/)",
    "EXTRAS": "the train, dev and milvus extras importable (torch, scikit-learn, matplotlib, schemathesis, mkdocs, dlib, milvus-lite)",
    "PINNED_ONNXRUNTIME": "the onnxruntime that made the int8 model's pinned bytes (models/dlib-resnet-v1-int8.json)",
    "POSTGRES": "Debian's postgresql server binaries and psycopg",
    "DOCKER_TOOLS": "hadolint, docker-compose and make",
    "CLIENTS": "the published CompreFace and DeepStack clients (make clients), and Node for the JavaScript SDK",
    "LINUX_ROOT": "Linux (/proc) and root (mounting a tmpfs)",
    "BROWSER": "Debian's chromium and chromium-driver, and selenium (the dev extra), for the console's browser test",
    "IMAGE_TEST": "a Docker engine and root, FACEGATE_IMAGE_TEST=1 (make image-test)",
}


def flag(name: str) -> str:
    if name not in NEEDS:
        raise KeyError(f"{name!r} is not a need of tests/requirements.py: {sorted(NEEDS)}")
    return f"FACEGATE_REQUIRE_{name}"


def required(name: str) -> bool:
    return os.environ.get(flag(name)) == "1"


def need(name: str, reason: str) -> NoReturn:
    """Skip for want of `name` (the reason says what is missing), or fail where its flag is set."""
    if required(name):
        pytest.fail(f"{reason}; {flag(name)}=1 requires it", pytrace=False)
    pytest.skip(f"{reason} ({flag(name)}=1 makes this a failure)", allow_module_level=True)


def importorskip(module: str, name: str = "EXTRAS") -> ModuleType:
    """The module, or `need(name)` saying why it does not import."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        need(name, f"{module} does not import ({exc}); it comes with the extras `make install-test` installs")
