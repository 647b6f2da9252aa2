"""The one place the settings choose the gallery store: PostgreSQL when FACEGATE_DATABASE_URL is
set (replicas share it), else the SQLite file under FACEGATE_DATA_DIR; and the vector index that
searches it: FAISS in this process (FACEGATE_INDEX) or Milvus shared by all (FACEGATE_MILVUS_URI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.core.errors import ExtraNotInstalled
from service.core.models.manifest import EmbedderKey
from service.core.settings import Settings
from service.gallery.collection_names import DEFAULT, folder
from service.gallery.extras import POSTGRES_EXTRA_MISSING, missing_extra
from service.gallery.index import NEAR_COPY, IndexConfig

if TYPE_CHECKING:  # imported where opened: PostgresGallery needs psycopg, an extra
    from service.gallery.pg_connections import Connections
    from service.gallery.postgres import PostgresGallery
    from service.gallery.sqlite import SqliteGallery


def open_gallery(
    settings: Settings,
    embedder: EmbedderKey | None,
    searchable: bool = True,
    background: bool = False,
    collection: str = DEFAULT,
    connections: Connections | None = None,
    near_copy: float = NEAR_COPY,
) -> SqliteGallery | PostgresGallery:
    """The gallery of one collection (collections.py). `searchable=False` for maintenance commands:
    no index is loaded and no changes followed. `background` (the server): the index and guard are
    built after it returns (searches 503 gallery_loading meanwhile). `connections`: PostgreSQL's pool
    and listener every collection of the server shares (`shared_connections`). `near_copy`: the
    embedder's (`near_copy_of`), which a trained index holds the recall check's faces back with."""
    if missing := missing_extra(settings):
        raise ExtraNotInstalled(missing)
    if settings.database_url.get_secret_value():
        return open_postgres(settings, embedder, searchable, background, collection, connections, near_copy)
    from service.gallery.sqlite import SqliteGallery

    config = index_config(settings, collection, near_copy)
    return SqliteGallery.open(settings.data_dir, embedder, searchable, config, settings.open_set_guard, background, collection)


def open_postgres(
    settings: Settings,
    embedder: EmbedderKey | None,
    searchable: bool = True,
    background: bool = False,
    collection: str = DEFAULT,
    connections: Connections | None = None,
    near_copy: float = NEAR_COPY,
) -> PostgresGallery:
    """The PostgreSQL gallery FACEGATE_DATABASE_URL names (the caller checked it is set)."""
    url = database_url(settings)
    from service.gallery.postgres import PostgresGallery

    return PostgresGallery(
        url,
        embedder,
        searchable,
        settings.database_pool_size,
        index_config(settings, collection, near_copy),
        settings.database_pool_timeout,
        settings.open_set_guard,
        background,
        collection,
        connections,
    )


def shared_connections(settings: Settings) -> Connections | None:
    """With PostgreSQL, the one pool and listener the server's collections share, connected by the
    first collection opened (pg_connections.py); None with SQLite."""
    if not settings.database_url.get_secret_value():
        return None
    url = database_url(settings)
    from service.gallery.pg_connections import Connections

    return Connections(url, settings.database_pool_size, settings.database_pool_timeout)


def database_url(settings: Settings) -> str:
    """FACEGATE_DATABASE_URL with the password of FACEGATE_DATABASE_PASSWORD_FILE, if set."""
    try:
        from psycopg.conninfo import make_conninfo  # psycopg is needed only here
    except ImportError:
        raise ExtraNotInstalled(POSTGRES_EXTRA_MISSING) from None
    url = settings.database_url.get_secret_value()
    if settings.database_password_file is not None:
        url = make_conninfo(url, password=settings.database_password_file.read_text().rstrip("\r\n"))
    return url


def index_config(settings: Settings, collection: str = DEFAULT, near_copy: float = NEAR_COPY) -> IndexConfig:
    """The index either store searches a collection with: FACEGATE_INDEX (FAISS, a persisted one kept
    under `collections/<name>/` of its folder for a collection other than `default`) or FACEGATE_MILVUS_URI."""
    directory = settings.index_dir or settings.data_dir / "index"
    return IndexConfig(
        settings.index,
        settings.index_search_params,
        directory if collection == DEFAULT else directory / "collections" / folder(collection),
        settings.milvus_uri,
        settings.milvus_token.get_secret_value(),
        settings.milvus_index,
        settings.milvus_consistency,
        settings.milvus_timeout,
        dict(settings.milvus_index_params),
        dict(settings.milvus_search_params),
        near_copy,
        settings.index_recall_sample,
    )
