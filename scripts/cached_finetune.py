"""Fine-tuning the last stages of a backbone on its frozen prefix, computed once.

With `finetune.freeze_stages: k` the first k stages of `dlib_resnet_v1` neither learn nor depend on
train/eval mode (dlib's batch norms are folded into fixed affines: no statistics), so their output
for a crop is a constant. `build_cache` runs them once over every crop and its mirror and stores the
activations; `CachedRun` then trains stages[k:], the fc and the head on them with the model, head,
optimizers, schedule, recipe and flip decisions of `facegate train` (whose only augmentation this
allows is the flip), at a small fraction of the compute on a CPU. Its checkpoints are
whole-backbone checkpoints that `facegate export` / `eval` / `calibrate` take as they are, and a run
resumes from its `last.pt`.

Research code of one benchmark (scripts/dlib_heads.py, docs/dlib-finetune.md), so it lives beside it
rather than in the `training` package: `facegate train` is the one product training loop.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from service.core.console import console, progress_bar
from service.core.fileio import write_atomically
from service.core.settings import Settings
from training.backbones import build_backbone
from training.checkpoint import load_checkpoint, save_checkpoint
from training.config import TrainConfig
from training.data.datasets import EpochBatches, make_pairs, open_source, split_identities
from training.data.preprocess import for_backbone
from training.heads import build_head
from training.heads.loss import HeadLoss
from training.trainer import Recipe, make_optimizers, optimizer_step
from training.verification import verification_metrics


def _cache_key(cfg: TrainConfig, n: int) -> dict:
    return {"train": str(Path(cfg.data.train).resolve()), "backbone": cfg.backbone, "stop": cfg.finetune.freeze_stages, "n": n}


def _write_json(path: Path, data: dict) -> None:
    write_atomically(path, (json.dumps(data, indent=2) + "\n").encode(), durable=False)


def build_cache(
    cfg: TrainConfig, settings: Settings, cache_dir: Path, chunk: int = 256, progress: bool = True, from_cache: Path | None = None
) -> Path:
    """stages[:freeze_stages] over every crop of cfg.data.train and its mirror → cache_dir/features.npy
    (N × 2 × C × H × W float32; [:, 1] = mirror) and labels.npy. Resumes where it stopped. With
    `from_cache` (a complete cache of fewer stages of the same data) only the stages in between run."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    prep, stop = for_backbone(cfg.backbone, settings.models_dir), cfg.finetune.freeze_stages
    source = open_source(cfg.data.train, prep.size)
    model = build_backbone(cfg.backbone, cfg.embedding_dim, settings, **cfg.backbone_params).eval()
    if not hasattr(model, "prefix") or stop < 1:
        raise ValueError(
            f"a prefix cache needs finetune.freeze_stages ≥ 1 on a backbone with `prefix` (dlib_resnet_v1), not {cfg.backbone}"
        )
    key, meta_path, path = _cache_key(cfg, len(source)), cache_dir / "meta.json", cache_dir / "features.npy"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    if meta is not None and meta["key"] != key:
        raise ValueError(f"{cache_dir} caches another prefix ({meta['key']}), not {key}")
    with torch.no_grad():
        shape = tuple(model.prefix(torch.zeros(1, 3, prep.size, prep.size), stop).shape[1:])
    if meta is None:
        np.save(cache_dir / "labels.npy", source.labels)
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(source), 2, *shape)).flush()
        meta = {"key": key, "shape": list(shape), "done": 0, "seconds": 0.0}
        _write_json(meta_path, meta)
    features = np.lib.format.open_memmap(path, mode="r+")
    first, before = 0, None
    if from_cache is not None:
        src_meta = json.loads((Path(from_cache) / "meta.json").read_text())
        first = src_meta["key"]["stop"]
        if src_meta["done"] != len(source) or {**src_meta["key"], "stop": stop} != key or first >= stop:
            raise ValueError(f"{from_cache} is not a complete cache of fewer stages of {cfg.data.train}")
        before = np.load(Path(from_cache) / "features.npy", mmap_mode="r")
    with progress_bar(f"prefix cache (stages[:{stop}])", len(source), enabled=progress) as advance:
        advance(meta["done"])
        for start in range(meta["done"], len(source), chunk):
            t0 = time.perf_counter()
            n = min(start + chunk, len(source)) - start
            if before is None:
                crops = np.stack([source.load(i)[0] for i in range(start, start + n)])
                x = prep.to_input(np.concatenate([crops, crops[:, :, ::-1]]))
            else:
                x = np.concatenate([before[start : start + n, 0], before[start : start + n, 1]])
            with torch.no_grad():
                y = model.prefix(torch.from_numpy(x), stop, start=first).numpy()
            features[start : start + n, 0], features[start : start + n, 1] = y[:n], y[n:]
            features.flush()
            meta["done"], meta["seconds"] = start + n, meta["seconds"] + time.perf_counter() - t0
            _write_json(meta_path, meta)
            advance(n)
    return path


class CachedRun:
    """`Trainer` for stages[freeze_stages:] + fc + head on a prefix cache (see the module's docstring)."""

    def __init__(self, cfg: TrainConfig, settings: Settings, cache_dir: Path) -> None:
        a = cfg.data.augment
        if a.random_resized_crop or a.color_jitter or a.blur or a.grayscale:
            raise ValueError("a prefix cache holds each crop and its mirror only: set data.augment to {flip: p}")
        cache_dir = Path(cache_dir)
        meta = json.loads((cache_dir / "meta.json").read_text())
        self.labels = np.load(cache_dir / "labels.npy")
        if meta["done"] != len(self.labels) or meta["key"] != _cache_key(cfg, len(self.labels)):
            raise ValueError(f"{cache_dir} is incomplete or caches another prefix: run build_cache with this config")
        self.cfg, self.start = cfg, cfg.finetune.freeze_stages
        self.features = np.load(cache_dir / "features.npy", mmap_mode="r")
        torch.manual_seed(cfg.seed)
        self.train_idx, val_idx = split_identities(self.labels, cfg.data.val_fraction, cfg.seed)
        pairs, self.issame = make_pairs(self.labels[val_idx], cfg.data.val_pairs, cfg.seed)  # as `holdout_set` draws them
        self.val_used, inverse = np.unique(val_idx[pairs], return_inverse=True)
        self.val_pairs = inverse.reshape(pairs.shape)
        self.val_folds = np.arange(cfg.data.val_pairs) * 10 // cfg.data.val_pairs
        self.num_classes = cfg.data.num_classes or int(self.labels.max()) + 1

        self.backbone = build_backbone(cfg.backbone, cfg.embedding_dim, settings, **cfg.backbone_params)
        self.recipe = Recipe(cfg, self.backbone)  # freezes stages[:start]: they are the cache
        self.criterion = HeadLoss(build_head(cfg.head.name, cfg.embedding_dim, self.num_classes, **cfg.head.params))
        self.steps_per_epoch = len(self.train_idx) // cfg.batch_size
        self.total_steps = cfg.steps or cfg.epochs * self.steps_per_epoch
        self.optimizers, self.schedulers = make_optimizers(cfg, self.backbone, self.criterion, self.total_steps)
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)  # float32 on the CPU: a pass-through
        self.step, self.epoch, self.micro_in_epoch, self.best, self.seconds = 0, 0, 0, None, 0.0

    # ---- checkpoints: the layout of `Trainer.state`, so export / eval / calibrate read them ----

    def state(self) -> dict:
        return {
            "backbone": self.backbone.state_dict(),
            "head": self.criterion.head.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "step": self.step,
            "epoch": self.epoch,
            "micro_in_epoch": self.micro_in_epoch,
            "best": self.best,
            "seconds": self.seconds,
            "rng": torch.get_rng_state(),
            "num_classes": self.num_classes,
            "world_size": 1,
            "config": self.cfg.model_dump(mode="json"),
        }

    def load(self, path: Path) -> None:
        state = load_checkpoint(path)
        self.backbone.load_state_dict(state["backbone"])
        self.criterion.head.load_state_dict(state["head"])
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)
        for sched, s in zip(self.schedulers, state["schedulers"], strict=True):
            sched.load_state_dict(s)
        self.step, self.epoch, self.micro_in_epoch = state["step"], state["epoch"], state["micro_in_epoch"]
        self.best, self.seconds = state["best"], state["seconds"]
        torch.set_rng_state(state["rng"])

    # ---- the loop ----

    def _forward(self, rows: np.ndarray, mirror: np.ndarray) -> torch.Tensor:
        return self.backbone(torch.from_numpy(np.ascontiguousarray(self.features[rows, mirror])), start=self.start)

    def train_step(self, rows: np.ndarray, mirror: np.ndarray) -> float:
        cfg = self.cfg
        head_only = self.recipe.head_only(self.step)
        self.backbone.train()
        self.recipe.set_modes(self.backbone, self.step)
        with torch.set_grad_enabled(not head_only):
            embeddings = self._forward(rows, mirror)
        labels = torch.from_numpy(self.labels[rows])
        loss = self.criterion(embeddings, labels)
        (loss + (0.0 if head_only else self.recipe.penalty())).backward()
        optimizer_step(cfg, self.optimizers, self.schedulers, [self.backbone, self.criterion], head_only, self.scaler)
        self.step += 1
        return float(loss.detach())

    @torch.no_grad()
    def validate(self) -> dict:
        """Held-out identities' pairs, 10-fold, with and without flip-TTA (as `Trainer.validate`)."""
        was = self.backbone.training
        self.backbone.eval()
        raw = [
            torch.cat(
                [
                    self._forward(self.val_used[i : i + 512], np.full(len(self.val_used[i : i + 512]), m))
                    for i in range(0, len(self.val_used), 512)
                ]
            ).numpy()
            for m in (0, 1)
        ]
        self.backbone.train(was)
        out = {}
        for key, e in (("no_flip", raw[0]), ("flip", raw[0] + raw[1])):
            e = e / np.linalg.norm(e, axis=1, keepdims=True)
            scores = np.sum(e[self.val_pairs[:, 0]] * e[self.val_pairs[:, 1]], axis=1)
            out[key] = verification_metrics(scores, self.issame, self.val_folds)
        return out

    def run(self, out: Path, stop_at: int | None = None, progress: bool = True) -> dict:
        """Train to the configured length or `stop_at` steps, resuming from out/last.pt; writes
        last.pt (every checkpoint_every steps), best.pt (best held-out flip accuracy) and result.json."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if (out / "last.pt").is_file():
            self.load(out / "last.pt")
        end = min(stop_at or self.total_steps, self.total_steps)
        cfg, flip_p, losses = self.cfg, self.cfg.data.augment.flip, []
        while self.step < end:
            t0, first = time.perf_counter(), self.step
            for batch in EpochBatches(len(self.train_idx), cfg.batch_size, cfg.seed, self.epoch, start=self.micro_in_epoch):
                rows = self.train_idx[[i for i, _ in batch]]
                # the flip `augment` would draw for this (index, seed): its generator's first number
                mirror = np.array([np.random.default_rng(s).random() < flip_p for _, s in batch], np.int64)
                losses.append(self.train_step(rows, mirror))
                self.micro_in_epoch += 1
                if self.step % cfg.log_every == 0 and progress:
                    console.print(f"step {self.step}/{end} loss {np.mean(losses[-cfg.log_every :]):.4f}")
                if self.step >= end or self.step % cfg.checkpoint_every == 0 or self.step % cfg.val_every == 0:
                    break
            else:
                self.epoch, self.micro_in_epoch = self.epoch + 1, 0
            self.seconds += time.perf_counter() - t0
            if self.step == first:  # an epoch's end that fell on a checkpoint: nothing new to check
                continue
            if self.step % cfg.val_every == 0 or self.step >= end:
                metrics = self.validate()
                if self.best is None or metrics["flip"]["accuracy"] > self.best:
                    self.best = metrics["flip"]["accuracy"]
                    save_checkpoint(self.state(), out / "best.pt")
                    _write_json(out / "best.json", {"step": self.step, **metrics})
                if progress:
                    console.print(f"step {self.step}: held-out accuracy {metrics['flip']['accuracy']:.4f} (flip)")
            save_checkpoint(self.state(), out / "last.pt")
        result = {
            "step": self.step,
            "total_steps": self.total_steps,
            "train_seconds": round(self.seconds, 1),
            "best_flip_accuracy": self.best,
        }
        _write_json(out / "result.json", result)
        return result
