"""The optional extras a gallery setting needs, and what is said when one is missing: read by the
stores' factory as it opens one and by `facegate serve` before it starts, whose process must not
import the stores (FAISS, NumPy and OpenCV: 55 MiB of private memory it never uses)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.core.settings import Settings

POSTGRES_EXTRA_MISSING = "FACEGATE_DATABASE_URL is set, but the PostgreSQL driver is not installed: pip install 'facegate[postgres]'"
MILVUS_EXTRA_MISSING = (
    "FACEGATE_MILVUS_URI is set, but Milvus' client is not installed: pip install 'facegate[milvus]' "
    "(the image: build it with --build-arg SERVE_EXTRAS=postgres,milvus, as compose.milvus.yaml does)"
)


def missing_extra(settings: Settings) -> str | None:
    """What the settings' stores need and this installation lacks, said as the error; None when nothing."""
    if settings.database_url.get_secret_value() and importlib.util.find_spec("psycopg") is None:
        return POSTGRES_EXTRA_MISSING
    if settings.milvus_uri and importlib.util.find_spec("pymilvus") is None:
        return MILVUS_EXTRA_MISSING
    return None
