"""The model manifest: the one contract between training (which writes it) and serving (which
refuses any model file that does not match it)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.errors import ModelError

ALIGNMENTS = ("arcface_112",)


def far_key(far: float | str) -> str:
    """Canonical text of a false-accept rate, e.g. 0.001 → "1e-3", so lookups never miss on spelling."""
    value = float(far)
    if not 0.0 < value < 1.0:
        raise ValueError(f"FAR must be in (0, 1), got {far}")
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10**exponent, 6)
    if mantissa == 10:
        mantissa, exponent = 1, exponent + 1
    mantissa_text = f"{mantissa:g}"
    return f"{mantissa_text}e{exponent}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileSpec(_Strict):
    name: str = Field(description="File name, looked up beside the manifest, then in the model cache.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(gt=0)
    url: str | None = Field(None, description="Official download location for `facegate models pull`.")


class TensorSpec(_Strict):
    name: str
    shape: list[int | str] = Field(description="Dimensions; a string (e.g. 'batch') is a dynamic axis.")


class InputSpec(TensorSpec):
    layout: Literal["NCHW"] = "NCHW"
    color: Literal["RGB", "BGR"]
    mean: list[float] | None = Field(None, description="Per-channel mean subtracted from 0–255 values; None = raw.")
    std: list[float] | None = Field(None, description="Per-channel divisor after the mean; None = raw.")

    @model_validator(mode="after")
    def _mean_std_together(self) -> InputSpec:
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std are given together, or neither (raw 0–255 input)")
        for values in (self.mean, self.std):
            if values is not None and len(values) != 3:
                raise ValueError("mean and std have one value per colour channel")
        if len(self.shape) != 4:
            raise ValueError("input shape is [batch, channels, height, width]")
        return self

    @property
    def height(self) -> int:
        return int(self.shape[2])

    @property
    def width(self) -> int:
        return int(self.shape[3])


class Manifest(_Strict):
    schema_version: Literal[1] = 1
    name: str
    version: str
    task: Literal["detector", "embedder"]
    file: FileSpec
    input: InputSpec
    outputs: list[TensorSpec] = Field(min_length=1)
    embedding_dim: int | None = Field(None, gt=0)
    alignment: str | None = Field(None, description="Face alignment the embedder expects, e.g. arcface_112.")
    thresholds: dict[str, float] = Field(default_factory=dict, description="FAR → cosine threshold.")
    metrics: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    license: dict[str, str] = Field(description="At least 'name'; 'terms' for usage restrictions.")

    @field_validator("thresholds")
    @classmethod
    def _canonical_far(cls, value: dict[str, float]) -> dict[str, float]:
        return {far_key(k): float(v) for k, v in value.items()}

    @field_validator("license")
    @classmethod
    def _license_named(cls, value: dict[str, str]) -> dict[str, str]:
        if not value.get("name"):
            raise ValueError("license needs a 'name'")
        return value

    @model_validator(mode="after")
    def _embedder_fields(self) -> Manifest:
        if self.task == "embedder":
            if self.embedding_dim is None:
                raise ValueError("an embedder manifest needs embedding_dim")
            if self.alignment not in ALIGNMENTS:
                raise ValueError(f"an embedder manifest needs alignment, one of {ALIGNMENTS}")
            if len(self.outputs) != 1:
                raise ValueError("an embedder has exactly one output")
        return self

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            return cls.model_validate_json(Path(path).read_bytes())
        except FileNotFoundError:
            raise ModelError(f"model manifest not found: {path}") from None
        except ValueError as exc:
            raise ModelError(f"invalid model manifest {path}: {exc}") from None

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n")

    def threshold(self, far: float | str) -> float:
        key = far_key(far)
        if key not in self.thresholds:
            raise KeyError(key)
        return self.thresholds[key]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_file(manifest: Manifest, path: Path) -> None:
    """Refuse a model file whose size or sha256 differ from the manifest's."""
    size = Path(path).stat().st_size
    if size != manifest.file.bytes:
        raise ModelError(f"{path}: {size} bytes, manifest {manifest.name} says {manifest.file.bytes}")
    digest = sha256_file(path)
    if digest != manifest.file.sha256:
        raise ModelError(f"{path}: sha256 {digest} does not match manifest {manifest.name} ({manifest.file.sha256})")


def _dims_match(declared: list[int | str], actual: list) -> bool:
    if len(declared) != len(actual):
        return False
    for want, got in zip(declared, actual):
        if isinstance(want, int) and isinstance(got, int) and want != got:
            return False
        if isinstance(want, int) and not isinstance(got, int):
            return False  # manifest promises a fixed size the model leaves dynamic
    return True


def verify_io(manifest: Manifest, inputs: list, outputs: list) -> None:
    """Check onnxruntime's NodeArg lists against the manifest's tensor names and shapes."""
    if len(inputs) != 1 or inputs[0].name != manifest.input.name:
        raise ModelError(f"{manifest.name}: model inputs {[i.name for i in inputs]}, manifest says [{manifest.input.name!r}]")
    if not _dims_match(manifest.input.shape, list(inputs[0].shape)):
        raise ModelError(f"{manifest.name}: input shape {inputs[0].shape}, manifest says {manifest.input.shape}")
    actual = {o.name: list(o.shape) for o in outputs}
    for spec in manifest.outputs:
        if spec.name not in actual:
            raise ModelError(f"{manifest.name}: model has no output {spec.name!r} (has {sorted(actual)})")
        if not _dims_match(spec.shape, actual[spec.name]):
            raise ModelError(f"{manifest.name}: output {spec.name} shape {actual[spec.name]}, manifest says {spec.shape}")
    if manifest.embedding_dim is not None and manifest.outputs[0].shape[-1] != manifest.embedding_dim:
        raise ModelError(f"{manifest.name}: output dim {manifest.outputs[0].shape[-1]} != embedding_dim {manifest.embedding_dim}")
