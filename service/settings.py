"""All run-time settings in one object, read from `FACEGATE_*` environment variables."""

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_MODELS = Path(__file__).resolve().parent.parent / "models"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FACEGATE_", extra="ignore")

    # models
    models_dir: Path = Field(REPO_MODELS, description="Folder of shipped manifests (and embedder files).")
    model_cache: Path = Field(
        Path("~/.cache/facegate").expanduser(),
        description="Where `facegate models pull` stores downloaded model files.",
    )
    detector: str = Field("face_detection_yunet_2023mar", description="Detector manifest: name in models_dir, or a path.")
    embedder: str = Field("facegate-default", description="Embedder manifest: name in models_dir, or a path.")

    # onnxruntime
    device: Literal["auto", "cpu", "cuda"] = "auto"
    intra_op_threads: int = Field(0, ge=0, description="onnxruntime intra-op threads per session; 0 = onnxruntime's choice.")
    embed_max_batch: int = Field(32, ge=1, description="Largest batch handed to the embedder in one run.")

    # input limits, checked before a full decode
    max_image_bytes: int = Field(10_000_000, ge=1)
    max_image_pixels: int = Field(40_000_000, ge=1)
    min_image_side: int = Field(16, ge=1)

    # detection
    det_score_threshold: float = Field(0.6, ge=0.0, le=1.0)
    det_nms_threshold: float = Field(0.3, ge=0.0, le=1.0)
    min_face_size: int = Field(20, ge=0, description="Faces whose box is smaller on its short side are ignored (px).")


@lru_cache
def get_settings() -> Settings:
    return Settings()
