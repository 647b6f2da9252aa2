"""Finding, downloading, verifying and loading model files against their manifests: the one way
a model is loaded (`load_model`), for the service, the CLI and training's evaluation.

Nothing here runs while a request is served: models are pulled ahead (`facegate models pull`)
and loaded once at start-up.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from service.errors import ModelError
from service.models.manifest import Manifest
from service.models.providers import create_session

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
    hint = "run `facegate models pull`" if manifest.file.url else "put the file beside its manifest"
    raise ModelError(
        f"model file {manifest.file.name} for {manifest.name} is missing "
        f"(looked in {Path(manifest_file).parent} and {cache}); {hint}"
    )


def pull(manifest: Manifest, cache: Path, url: str | None = None, timeout: float = 60.0) -> Path:
    """Download a model file into the cache, checking size and sha256 before it takes its name.

    The download goes to a temporary file in the cache folder and is renamed atomically only when
    it matches the manifest, so a failed or forged download leaves nothing behind.
    """
    cache = Path(cache).expanduser()
    target = cache / manifest.file.name
    if target.is_file():
        try:
            verify_file(manifest, target)
            return target
        except ModelError:
            log.warning("%s in the cache does not match its manifest; downloading again", target)
    source = url or manifest.file.url
    if not source:
        raise ModelError(f"{manifest.name} has no download URL; put {manifest.file.name} beside its manifest")
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{manifest.file.name}.", suffix=".part", dir=cache)
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(source, timeout=timeout) as response:
            while block := response.read(1 << 16):
                size += len(block)
                if size > manifest.file.bytes:
                    raise ModelError(f"{source}: larger than the {manifest.file.bytes} bytes the manifest says")
                digest.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if size != manifest.file.bytes:
            raise ModelError(f"{source}: got {size} bytes, the manifest says {manifest.file.bytes}")
        if digest.hexdigest() != manifest.file.sha256:
            raise ModelError(f"{source}: sha256 {digest.hexdigest()} does not match the manifest ({manifest.file.sha256})")
        os.replace(tmp_name, target)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        Path(tmp_name).unlink(missing_ok=True)
        raise ModelError(f"cannot download {manifest.name} from {source}: {exc}") from None
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


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


@dataclass(frozen=True)
class LoadedModel:
    manifest: Manifest
    path: Path
    session: ort.InferenceSession


def load_model(name_or_path: str, models_dir: Path, cache: Path, device: str = "auto", intra_op_threads: int = 0) -> LoadedModel:
    """Manifest → verified file → onnxruntime session whose inputs/outputs match the manifest."""
    mpath = manifest_path(name_or_path, models_dir)
    manifest = Manifest.load(mpath)
    path = find_model_file(manifest, mpath, cache)
    verify_file(manifest, path)
    session = create_session(path, device=device, intra_op_threads=intra_op_threads)
    verify_io(manifest, session.get_inputs(), session.get_outputs())
    return LoadedModel(manifest, path, session)
