"""A copy of an embedder (float32 NCHW) with its preprocessing moved into the graph (uint8 NHWC input,
`service/core/models/in_graph.py`), written with its manifest to a folder: what the "uint8 NHWC (in
graph)" rows of docs/benchmarks.md ran (`facegate bench all --embedder OUT/NAME.json`). The shipped
files stay float32 NCHW.

    .venv/bin/python benchmarks/in_graph_copy.py dlib-resnet-v1 /tmp/in-graph
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from service.core.fileio import sha256_file
from service.core.models.files import find_model_file, manifest_path
from service.core.models.in_graph import in_graph_spec, uint8_nhwc_input
from service.core.models.manifest import Manifest
from service.core.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "embedder", help="A manifest: a name in models/ or a path (its file pulled: `make test` or `facegate models pull`)."
    )
    parser.add_argument("out", type=Path, help="Folder for the copy and its manifest.")
    args = parser.parse_args()
    settings = Settings()
    source = manifest_path(args.embedder, settings.models_dir)
    manifest = Manifest.load(source)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / manifest.file.name
    onnx.save(uint8_nhwc_input(onnx.load(str(find_model_file(manifest, source, settings.model_cache))), manifest.input), model)
    file = manifest.file.model_copy(update={"sha256": sha256_file(model), "bytes": model.stat().st_size})
    manifest.model_copy(update={"input": in_graph_spec(manifest.input), "file": file}).save(args.out / source.name)
    print(args.out / source.name)


if __name__ == "__main__":
    main()
