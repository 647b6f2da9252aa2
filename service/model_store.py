"""Finding, downloading and loading model files against their manifests.

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
from service.manifest import Manifest, verify_file, verify_io
from service.runtime import create_session

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
