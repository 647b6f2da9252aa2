"""Identity folders (`ROOT/<identity>/<image>`), without torch: `facegate align`'s worker processes
import this and stay light."""

from __future__ import annotations

from pathlib import Path

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def list_identity_folders(root: Path) -> list[tuple[str, list[Path]]]:
    """`root/<identity>/<image>` → [(identity, sorted image paths)], identities sorted."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if images:
            out.append((folder.name, images))
    return out
