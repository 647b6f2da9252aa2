"""All run-time settings in one object, read from `FACEGATE_*` environment variables."""

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
# Settings that were replaced: still set, they would be ignored silently, so start-up says what replaced them.
REPLACED = {"FACEGATE_EMBED_MAX_BATCH": "FACEGATE_BATCH_SIZES, a JSON list of the batch sizes the embedder runs at, e.g. [1,2,4,8]"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FACEGATE_", extra="ignore")

    # models
    models_dir: Path = Field(REPO_MODELS, description="Folder of shipped manifests (and embedder files).")
    model_cache: Path = Field(
        Path("~/.cache/facegate").expanduser(),
        description="Where `facegate models pull` stores downloaded model files.",
    )
    detector: str = Field("face_detection_yunet_2023mar", description="Detector manifest: name in models_dir, or a path.")
    embedder: str = Field("dlib-resnet-v1", description="Embedder manifest: name in models_dir, or a path.")

    # onnxruntime (service/core/models/providers.py applies these; GET /readyz shows what each session got)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cuda_device_id: int = Field(0, ge=0, description="GPU the CUDA (and TensorRT) provider runs on.")
    cudnn_conv_algo_search: Literal["HEURISTIC", "EXHAUSTIVE", "DEFAULT"] = Field(
        "HEURISTIC",
        description=(
            "cuDNN convolution algorithm search per input shape: HEURISTIC is cheap, EXHAUSTIVE benchmarks every algorithm "
            "(slow first run of each shape)."
        ),
    )
    gpu_mem_limit: int = Field(0, ge=0, description="Bytes the CUDA provider's memory arena may hold; 0 = no limit.")
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = Field(
        "kNextPowerOfTwo",
        description="How the CUDA memory arena grows: kSameAsRequested wastes less memory, kNextPowerOfTwo allocates less often.",
    )
    tensorrt: bool = Field(
        False, description="Put the TensorRT provider before CUDA when onnxruntime offers it (engines cached under model_cache/tensorrt)."
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description=(
            "onnxruntime intra-op threads per session; 0 = 1 on a GPU, else the CPU cores this process may use (cgroup quota and affinity)."
        ),
    )
    intra_op_spinning: bool = Field(
        False, description="Let idle onnxruntime threads spin-wait for work (lower latency alone on a host, CPU burnt when sharing it)."
    )
    batch_sizes: list[int] | None = Field(
        None,
        min_length=1,
        description=(
            "The only batch sizes the embedder runs at (JSON list): a batch is padded to the next, split above the largest; "
            "each is warmed up at start-up. Unset: [1, 2, 4, 8] on a CPU, up to 128 on a GPU."
        ),
    )
    detect_batch_sizes: list[int] | None = Field(
        None,
        min_length=1,
        description=(
            "The only batch sizes the detector runs at (images of concurrent requests of one input size; each warmed at each size). "
            "Unset: [1, 2] on a CPU, up to 32 on a GPU."
        ),
    )
    detect_sizes: list[int] = Field(
        [320, 480, 640],
        min_length=1,
        description="The square input sizes the detector runs at (multiples of 32): each photo at the smallest holding its longer side, "
        "a larger one shrunk to the largest; [640] letterboxes every photo to 640 as before.",
    )

    # input limits, checked before a full decode
    max_image_bytes: int = Field(10_000_000, ge=1)
    max_image_pixels: int = Field(40_000_000, ge=1)
    min_image_side: int = Field(16, ge=1)
    max_decoded_megapixels: float = Field(
        200.0,
        gt=0,
        description=(
            "Decoded image pixels held at once across requests (3 bytes each, twice while decoding): the memory bound of docs/sizing.md."
        ),
    )
    costly_megapixels: float = Field(
        4.0,
        gt=0,
        description="Images above this many megapixels (after the header check: a large JPEG at its reduced size) go through a "
        "lane one thread narrower than FACEGATE_WORKER_THREADS (at least one), so that cheap photos never wait behind them.",
    )
    client_megapixels: float = Field(
        64.0,
        gt=0,
        description="Megapixels of images one client (its API key, else its address) may have in flight at once, across the "
        "worker processes of `facegate serve --workers N` (counted by their model host); beyond it 503 overloaded at once "
        "(one image always fits).",
    )
    jpeg_reduce_to_side: int = Field(
        4000,
        ge=0,
        description=(
            "A JPEG is decoded at 1/2, 1/4 or 1/8 scale, the most that keeps its long side at least this many px (0: always full size)."
        ),
    )
    decode_wait: float = Field(
        60.0,
        ge=0,
        description="Seconds an image waits for room in FACEGATE_MAX_DECODED_MEGAPIXELS, and a request body for room in "
        "FACEGATE_MAX_BODY_MEGABYTES; then 503 overloaded.",
    )
    decode_timeout: float = Field(
        10.0,
        gt=0,
        description="CPU seconds one image may take to be probed or decoded in its decoder process (and 5× that in wall-clock "
        "time); then the process is killed (and replaced) and the request gets 422 image_too_complex.",
    )
    decode_memory_mb: int = Field(
        1024,
        ge=64,
        description="Memory a decoder process may allocate for one image (RLIMIT_DATA above its idle size, Linux); "
        "an image that needs more gets 413 image_too_large. It must hold a decode at FACEGATE_MAX_IMAGE_PIXELS (docs/sizing.md).",
    )

    # detection
    det_score_threshold: float = Field(0.6, ge=0.0, le=1.0)
    det_nms_threshold: float = Field(0.3, ge=0.0, le=1.0)
    min_face_size: int = Field(20, ge=0, description="Faces whose box is smaller on its short side are ignored (px).")

    # decisions
    default_far: str = Field("1e-3", description="FAR whose manifest threshold decides when a request names neither far nor threshold.")
    default_fpir: float = Field(
        1e-2,
        gt=0,
        lt=1,
        description="False-positive identification rate /identify decides at when a request names no fpir, far or threshold.",
    )

    cohort: Path | None = Field(
        None,
        description=(
            "A cohort manifest (`facegate calibrate-cohort`): /identify's FPIR decisions then use AS-norm scores against it (docs/api.md)."
        ),
    )
    open_set_guard: bool = Field(
        True,
        description=(
            "Keep every enrolled face's leave-one-out margin score, which tightens /identify's threshold from 100 subjects up when "
            "the gallery's own faces say strangers would pass too often (docs/api.md). It holds the embeddings once more in memory, "
            "costs one product with every face per enrollment and one search per face at start-up; false: the table alone decides."
        ),
    )

    # gallery
    data_dir: Path = Field(Path("data"), description="Folder of the gallery's SQLite database (the source of truth).")
    database_url: SecretStr = Field(
        SecretStr(""),
        description=(
            "postgresql://user:password@host:5432/db: the gallery lives in PostgreSQL, shared by every replica; "
            "empty = SQLite under data_dir."
        ),
    )
    database_password_file: Path | None = Field(
        None,
        description="File holding the PostgreSQL password (a compose secret), so the URL carries none; one line, trailing newline ignored.",
    )
    database_pool_size: int = Field(
        8, ge=2, description="Connections each replica keeps to PostgreSQL at most, all its collections together (FACEGATE_DATABASE_URL)."
    )
    database_pool_timeout: float = Field(
        1.0,
        gt=0,
        description=(
            "Seconds a request waits for a PostgreSQL connection (and to connect); "
            "then 503 gallery_unavailable instead of holding a thread through an outage."
        ),
    )
    index: str = Field(
        "Flat",
        description=(
            "The FAISS index that searches the gallery, as a FAISS index factory string: Flat (exact, the default), HNSW32, "
            "IVF4096,Flat, IVF4096,PQ32...; approximate ones are persisted under index_dir "
            "and their candidates re-scored exactly (docs/scaling.md)."
        ),
    )
    index_search_params: str = Field(
        "",
        description=(
            "FAISS search parameters for the index, e.g. efSearch=128 (HNSW) or nprobe=32 (IVF); empty = facegate's default "
            "for the index's kind and the gallery's size, aiming at recall@1 0.99 (docs/scaling.md)."
        ),
    )
    index_dir: Path | None = Field(None, description="Where a non-flat index is persisted between restarts; unset = data_dir/index.")
    min_index_recall: float = Field(
        0.97,
        ge=0.0,
        le=1.0,
        description=(
            "Below this measured recall@1 the approximate index's search is widened until it is met; where the widest "
            "cannot meet it, searches are answered from an exact copy and /readyz lists a problem."
        ),
    )
    index_recall_sample: int = Field(
        1000,
        ge=0,
        description=(
            "Held-out queries the index's recall check searches (enrolled faces of subjects with another, each left out; "
            "near copies where too few); 0 = no check."
        ),
    )
    index_recall_live: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=(
            "Share of /identify's query embeddings the recall check keeps (in memory, the last 2 x the sample) and searches "
            "again exactly on its own thread; those whose exact best passes their decision are its sample once there are "
            "half the sample of them; 0 = the held-out sample only."
        ),
    )
    index_recall_every: int = Field(
        10_000, ge=1, description="Faces added or removed between two recall checks of the index (one also runs at start-up)."
    )
    milvus_uri: str = Field(
        "",
        description=(
            "Milvus as the vector index every replica shares: http://host:19530 (a server), "
            "or a local .db file (Milvus Lite, one process); empty = FAISS in each process."
        ),
    )
    milvus_token: SecretStr = Field(SecretStr(""), description="Milvus credentials, user:password or an API key.")
    milvus_index: str = Field("AUTOINDEX", description="Milvus index type of a new collection (AUTOINDEX, HNSW, IVF_FLAT, FLAT...).")
    milvus_index_params: dict[str, int | float | str] = Field(
        default_factory=dict,
        description="Build parameters of a new Milvus collection's index, JSON (e.g. {\"nlist\": 4096}); empty = facegate's defaults.",
    )
    milvus_search_params: dict[str, int | float | str] = Field(
        default_factory=dict,
        description='Milvus search parameters, JSON (e.g. {"nprobe": 64} or {"ef": 256}); empty = facegate\'s default for the index.',
    )
    milvus_consistency: Literal["Strong", "Bounded", "Session", "Eventually"] = Field(
        "Strong",
        description=(
            "Milvus consistency level of searches: Strong makes a 2xx enrollment searchable on every replica at once (docs/scaling.md)."
        ),
    )
    milvus_timeout: float = Field(5.0, gt=0, description="Seconds a Milvus call may take before the request gets 503 gallery_unavailable.")
    store_crops: bool = Field(
        False,
        description=(
            "Keep an image of each enrolled face (biometric data) so `facegate gallery reembed` can re-embed after a model change: "
            "a 320×320 PNG chip with margin around the face and its five landmarks (an aligned upload is kept as sent)."
        ),
    )
    enroll_min_score: float = Field(0.75, ge=0.0, le=1.0, description="Enrollment refuses faces with a lower detection score.")
    enroll_min_face_size: int = Field(48, ge=0, description="Enrollment refuses faces whose box is smaller on its short side (px).")
    enroll_quality_gate: bool = Field(
        True, description="Enrollment refuses faces that fail a quality check (the FACEGATE_ENROLL_* limits); false: none is checked."
    )
    enroll_max_yaw: float = Field(
        0.4, ge=0.0, description="Enrollment refuses a face turned aside: the nose tip this many eye distances off the eyes' midpoint."
    )
    enroll_max_roll: float = Field(20.0, ge=0.0, le=180.0, description="Enrollment refuses a head tilted more than this (degrees).")
    enroll_min_sharpness: float = Field(
        30.0, ge=0.0, description="Enrollment refuses a blurred face: variance of the Laplacian of its aligned chip at 112×112 below this."
    )
    enroll_min_brightness: float = Field(
        50.0,
        ge=0.0,
        le=255.0,
        description="Enrollment refuses a dark face: mean grey level (0–255) of its aligned chip's centre below this.",
    )
    max_bulk_images: int = Field(20, ge=1, description="Most images one bulk enrollment request may carry.")
    max_metadata_depth: int = Field(16, ge=1, description="Deepest nesting of a subject's metadata (the object itself is level 1).")
    max_metadata_bytes: int = Field(16_384, ge=2, description="Largest subject metadata, serialized as JSON.")
    max_page_bytes: int = Field(
        4_000_000, ge=1, description="A GET /subjects page stops before this many bytes (next_offset says where to go on)."
    )

    # throughput
    worker_threads: int = Field(
        0,
        ge=0,
        description=(
            "Threads that decode, letterbox and align (nothing heavy runs on the event loop); 0 = the CPU cores this process may use."
        ),
    )
    search_threads: int = Field(
        1, ge=1, description="FAISS OpenMP threads (process-wide); raise only for very large galleries on an idle many-core host."
    )
    batching: bool = Field(
        True, description="Collect the images (detector) and faces (embedder) of concurrent requests into one model run."
    )
    warm_up_before_listening: bool = Field(
        False,
        description="Warm up before the port opens, so that a process that accepts a connection is ready (replicas behind a "
        "load balancer: a connection refused is retried elsewhere, a warm-up 503 is not); /healthz then waits too.",
    )
    batch_wait_ms: float = Field(2.0, ge=0.0, le=1000.0, description="How long a micro-batcher waits for more work after the first item.")
    idle_trim_seconds: float = Field(
        30.0,
        ge=0.0,
        description="Seconds without work after which each process gives back the memory its last burst freed, and an HTTP process "
        "its spare decoders (the next request pays its page faults again, about 10 ms); 0 = never.",
    )
    workers: int = Field(
        1,
        ge=0,
        description="HTTP worker processes `facegate serve` starts (its --workers); with more than one, one model host runs the "
        "models for all of them. 0: the cores this process may use less two, at least two (a GPU host's choice).",
    )
    model_host: Path | None = Field(
        None,
        description="Unix socket of the model host this process runs its models through (`facegate serve --workers N` starts one "
        "and sets it for its workers); unset: the models run in this process.",
    )
    ready_workers_dir: Path | None = Field(
        None,
        description="Folder where each worker of `facegate serve --workers N` records it is ready, so that every worker's /readyz "
        "answers for all N (`facegate serve` makes it and sets it, with FACEGATE_WORKERS, for its workers).",
    )
    model_run_timeout: float = Field(
        30.0,
        gt=0.0,
        description="Seconds a request waits for one model run (its batch's queue included) before it answers 503 "
        "model_unavailable: a stuck model or model host never holds a request longer.",
    )
    model_host_shared_memory: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Bytes of shared memory (/dev/shm) each worker reserves for the pixels it hands the model host; less where "
        "/dev/shm has less room, 0: they go through the socket.",
    )

    # security and limits
    api_keys: SecretStr = Field(SecretStr(""), description="Comma-separated API keys, or sha256:<hex> hashes of keys; empty = no auth.")
    api_keys_file: Path | None = Field(None, description="File of API keys or sha256:<hex> hashes, one a line ('#' comments).")
    max_request_bytes: int = Field(25_000_000, ge=1, description="Request bodies above this size get 413 before they are read.")
    max_body_megabytes: float = Field(
        200.0,
        gt=0,
        description="Request bodies held at once across requests, in MB (10⁶ bytes): what has arrived of each, until its answer "
        "(never what it declares); a piece that does not fit waits, unread (FACEGATE_DECODE_WAIT), then 503 overloaded. "
        "The memory bound of docs/sizing.md.",
    )
    max_faces: int = Field(
        32, ge=1, description="Most faces one image may hold where every face is embedded (/embed, /identify faces=all)."
    )
    max_identify_candidates: int = Field(1000, ge=1, description="Most candidates one /identify may return: faces × top_k.")
    allow_anonymous: bool = Field(False, description="Let `facegate serve` bind a non-loopback address with no API keys configured.")

    # the HTTP server (uvicorn, as `facegate serve` runs it)
    timeout_keep_alive: int = Field(5, ge=1, description="Seconds an idle keep-alive connection is kept open.")
    header_timeout: float = Field(
        10.0,
        gt=0,
        description=(
            "Seconds a connection has to send a request's line and headers (from connecting, or from its previous response); "
            "then it is closed."
        ),
    )
    body_timeout: float = Field(
        60.0, gt=0, description="Seconds a request has to send its whole body; then 408 request_timeout and the connection is closed."
    )
    body_min_rate: int = Field(
        16_384,
        ge=0,
        description="Bytes per second a request body must keep arriving at: at least this many times 5 in every 5 s until it "
        "ends (time it waits for room in FACEGATE_MAX_BODY_MEGABYTES aside), else 408 request_timeout and the connection is "
        "closed, so that a trickle cannot hold a slot or its share of the body budget (0: only FACEGATE_BODY_TIMEOUT).",
    )
    backlog: int = Field(2048, ge=1, description="Connections the kernel queues before `facegate serve` accepts them (listen backlog).")
    max_inflight_requests: int = Field(
        64,
        ge=1,
        description="Requests served at once, /healthz, /readyz and /metrics aside (they are never refused); "
        "beyond it 503 overloaded with Retry-After. Open connections are not counted.",
    )
    max_unauthenticated_requests: int = Field(
        16,
        ge=1,
        description="Requests served at once whose key is not known until their body is read (DeepStack's api_key form field); "
        "they never take one of FACEGATE_MAX_INFLIGHT_REQUESTS until it checks out. Beyond it 503 overloaded. Counted for the "
        "whole host with `facegate serve --workers N` (by the model host).",
    )
    max_unauthenticated_per_client: int = Field(
        4, ge=1, description="Of FACEGATE_MAX_UNAUTHENTICATED_REQUESTS, the most from one client address."
    )
    h11_max_incomplete_event_size: int = Field(
        16_384, ge=1024, description="Largest request line + headers, in bytes (the h11 parser's limit)."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_replaced_settings(cls, values):
        for name, replacement in REPLACED.items():
            if name in os.environ:
                raise ValueError(f"{name} is no longer read: use {replacement}")
        return values

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        if url and not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("FACEGATE_DATABASE_URL must be a postgresql:// URL (or empty for SQLite)")
        return value

    @field_validator("batch_sizes", "detect_batch_sizes")
    @classmethod
    def _positive_sizes(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is None:
            return None
        if any(n < 1 for n in sizes):
            raise ValueError("batch sizes must be positive")
        return sorted(set(sizes))

    @field_validator("detect_sizes")
    @classmethod
    def _stride_multiples(cls, sizes: list[int]) -> list[int]:
        if any(n < 32 or n % 32 for n in sizes):
            raise ValueError("detector input sizes must be positive multiples of 32 (YuNet's largest stride)")
        return sorted(set(sizes))


@lru_cache
def get_settings() -> Settings:
    return Settings()
