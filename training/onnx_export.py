"""Offline export: checkpoint → a single-file ONNX embedder + its manifest (the service's schema).

The export is not trusted until onnxruntime agrees with torch: a parity check at batch 1 and 16 on
real aligned crops (from the run's training data when readable) must give cosine ≥ 0.9999 between
the normalized embeddings (0.999 for --fp16), or the command fails and leaves no model behind.

By default the model takes the aligned crops as uint8 NHWC and normalizes them in its graph
(`service.core.models.in_graph`): the same embeddings as numpy preprocessing, done on the device when
the service runs on a GPU. `input_format="float32_nchw"` keeps the older form.
"""

from __future__ import annotations

import platform
import subprocess
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from service.core.fileio import replacing, sha256_file
from service.core.models.embedder import l2_normalize, preprocess
from service.core.models.files import manifest_path
from service.core.models.in_graph import in_graph_spec, uint8_nhwc_input
from service.core.models.manifest import Manifest
from service.core.settings import Settings
from training.checkpoint import load_backbone
from training.config import TrainConfig
from training.data.datasets import open_source
from training.data.preprocess import DEFAULT, IMPORTED_INPUT, OUTPUT_NAME, Preprocessing, for_backbone

MIN_OPSET = 17
PARITY = {False: 0.9999, True: 0.999}  # fp16 → threshold
INPUT_FORMATS = ("uint8_nhwc", "float32_nchw")
REPO = Path(__file__).resolve().parent.parent


class ExportError(RuntimeError):
    pass


class _Float16(nn.Module):
    """float32 in and out, float16 inside, so the manifest's preprocessing stays the same."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone.half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x.half()).float()


class _FlipSum(nn.Module):
    """Flip test-time augmentation inside the graph: the embedding of a crop plus that of its mirror,
    so the service gets the better embedding without a second call (at twice the compute)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        both = self.backbone(torch.cat([x, x.flip(3)]))
        return both[: x.shape[0]] + both[x.shape[0] :]


def base_model(backbone: str, models_dir: Path) -> dict | None:
    """The imported model a fine-tuned backbone started from (its manifest in `models_dir`): its name, weights and licence."""
    if backbone not in IMPORTED_INPUT:
        return None
    m = Manifest.load(manifest_path(IMPORTED_INPUT[backbone], models_dir))
    source = m.file.source
    return {
        "name": m.name,
        "version": m.version,
        "weights_sha256": source.weights_sha256 if source else m.file.sha256,
        "license": m.license,
    }


def combined_license(data: dict[str, str], base: dict) -> dict[str, str]:
    """Both terms: the training data's (which bind the fine-tuned weights) and the base weights'."""
    b = base["license"]
    return {
        "name": f"{data['name']} (training data) + {b['name']} (base model {base['name']})",
        "terms": f"training data: {data.get('terms', 'unspecified')}; base weights: {b.get('terms', b['name'])}",
    }


def git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return f"{sha}{'-dirty' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return None


def parity_crops(config: TrainConfig, n: int = 16, size: int = DEFAULT.size) -> tuple[np.ndarray, str]:
    """n aligned crops from the run's training data, or smooth synthetic images when it is gone."""
    try:
        source = open_source(config.data.train, size)
        picks = np.linspace(0, len(source) - 1, n).astype(int)
        return np.stack([source.load(int(i))[0] for i in picks]), "training data"
    except (OSError, ValueError):
        rng = np.random.default_rng(0)
        small = rng.integers(0, 256, size=(n, 7, 7, 3)).astype(np.float32)
        import cv2

        crops = np.stack([cv2.resize(s, (size, size), interpolation=cv2.INTER_CUBIC) for s in small])
        return np.clip(crops, 0, 255).astype(np.uint8), "synthetic"


def check_parity(
    backbone: nn.Module, onnx_path: Path, crops: np.ndarray, fp16: bool, prep: Preprocessing = DEFAULT, input_format: str = "uint8_nhwc"
) -> float:
    """The smallest cosine between float32 torch's and onnxruntime's normalized embeddings over batch 1 and
    batch len(crops), onnxruntime fed as the service feeds it; raises ExportError below the threshold."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    spec = _input_spec(input_format, prep)
    worst = 1.0
    for batch in (crops[:1], crops):
        with torch.no_grad():
            expected = l2_normalize(backbone(torch.from_numpy(prep.to_input(batch))).float().numpy())
        feed = preprocess(batch, spec)
        got = l2_normalize(session.run([OUTPUT_NAME], {spec.name: feed})[0].astype(np.float32))
        if got.shape != expected.shape:
            raise ExportError(f"onnxruntime returned {got.shape}, torch {expected.shape}")
        worst = min(worst, float(np.sum(got * expected, axis=1).min()))
    if not worst >= PARITY[fp16]:
        raise ExportError(f"parity check failed: cosine(torch, onnxruntime) = {worst:.6f} < {PARITY[fp16]}")
    return worst


def _input_spec(input_format: str, prep: Preprocessing = DEFAULT):
    if input_format not in INPUT_FORMATS:
        raise ExportError(f"input format is one of {INPUT_FORMATS}, got {input_format!r}")
    return in_graph_spec(prep.spec) if input_format == "uint8_nhwc" else prep.spec


def export(
    checkpoint: Path,
    out: Path,
    settings: Settings,
    fp16: bool = False,
    input_format: str = "uint8_nhwc",
    flip_tta: bool = False,
    opset: int = MIN_OPSET,
    metrics: dict | None = None,
    license: dict[str, str] | None = None,
    version: str | None = None,
) -> Manifest:
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} < {MIN_OPSET}")
    _input_spec(input_format)  # a bad format fails before the checkpoint is read
    out = Path(out)
    if out.suffix != ".onnx":
        raise ExportError(f"--out must name an .onnx file, got {out}")
    backbone, config, state = load_backbone(checkpoint, settings)
    prep = for_backbone(config.backbone, settings.models_dir)
    input_spec = _input_spec(input_format, prep)
    size = prep.size
    backbone = backbone.float()
    reference = _Float16(load_backbone(checkpoint, settings)[0]).eval() if fp16 else backbone
    if flip_tta:  # the parity reference is the float32 model with the same augmentation
        backbone, reference = _FlipSum(backbone).eval(), _FlipSum(reference).eval()
    with replacing(out, suffix=".onnx", durable=False) as tmp:  # nothing under `out` until the parity check passes
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter, chosen on purpose
            torch.onnx.export(
                reference,
                (torch.zeros(1, 3, size, size),),
                str(tmp),
                input_names=[prep.spec.name],
                output_names=[OUTPUT_NAME],
                dynamic_axes={prep.spec.name: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,  # the dynamo exporter needs onnxscript, which the project does not install
            )
        import onnx

        onnx.checker.check_model(str(tmp))
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(str(tmp), load_external_data=False).graph.initializer):
            raise ExportError("the export uses external data; a model must be a single file")
        if input_spec.in_graph:  # float32 preprocessing in front of the (float32 or float16) network
            onnx.save(uint8_nhwc_input(onnx.load(str(tmp)), prep.spec), str(tmp))
        crops, crops_from = parity_crops(config, size=size)
        worst = check_parity(backbone, tmp, crops, fp16, prep, input_format)

    dim = config.embedding_dim
    base = base_model(config.backbone, settings.models_dir)
    data_license = license or config.data.license
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        backbone(torch.zeros(1, 3, size, size))
    manifest = Manifest(
        name=out.stem,
        version=version or f"{config.backbone}-{config.head.name}-step{state['step']}",
        task="embedder",
        file={"name": out.name, "sha256": sha256_file(out), "bytes": out.stat().st_size},
        input=input_spec,
        outputs=[{"name": OUTPUT_NAME, "shape": ["batch", dim]}],
        embedding_dim=dim,
        alignment=prep.alignment,
        thresholds={},
        metrics=metrics or {},
        provenance={
            "backbone": config.backbone,
            "head": config.head.model_dump(mode="json"),
            "data": {"train": str(config.data.train), "num_classes": state["num_classes"]},
            "config": config.model_dump(mode="json"),
            "step": state["step"],
            **({"base_model": base} if base else {}),
            "checkpoint_sha256": sha256_file(checkpoint),
            "git_commit": git_commit(),
            "export": {
                "opset": opset,
                "fp16": fp16,
                "dtype": "float16" if fp16 else "float32",  # of the weights and arithmetic; the output is float32
                "flip_tta": flip_tta,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "parity_min_cosine": round(worst, 7),
                "parity_inputs": crops_from,
                "gflops_per_face": round(counter.get_total_flops() / 1e9, 4),  # multiply and add counted apart
            },
        },
        license=combined_license(data_license, base) if base else data_license,
    )
    manifest.save(out.with_suffix(".json"))
    return manifest
