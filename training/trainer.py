"""The training loop: one CPU process to many GPUs under torchrun, one code path.

The backbone runs under DistributedDataParallel; the head is either whole (DDP-wrapped when ranks > 1)
or sharded across ranks (training.distributed.sharded_head). Everything that shapes the run's numbers
is in the checkpoint — weights, optimizer, LR schedule, grad scaler, RNG, and the position in the
epoch — and the data order and each sample's augmentation are functions of (seed, epoch, index), so
a resumed run continues bit-for-bit where the hardware allows.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from service.core.settings import Settings
from training.backbones import build_backbone, stages
from training.checkpoint import checkpoint_config, load_checkpoint, save_checkpoint, shard_path
from training.config import TrainConfig
from training.data.datasets import EpochBatches, FaceDataset, Subset, open_source, split_identities
from training.data.preprocess import for_backbone
from training.distributed.process_group import Dist, init_distributed
from training.distributed.sharded_head import ShardedHead, shard_range
from training.heads import build_head
from training.heads.base import head_scale
from training.heads.loss import HeadLoss
from training.pair_evaluation import TorchEmbedder, evaluate, holdout_set, load_bin


@dataclass
class RunResult:
    step: int
    losses: list[float] = field(default_factory=list)  # one per optimizer step of this process's run
    best: float | None = None


def lr_factor(cfg: TrainConfig, total_steps: int):
    """step → multiplier of the base LR: linear warm-up, then cosine / poly / step decay."""
    o = cfg.optim

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        progress = min((step - o.warmup_steps) / max(total_steps - o.warmup_steps, 1), 1.0)
        if o.schedule == "cosine":
            decay = 0.5 * (1 + math.cos(math.pi * progress))
        elif o.schedule == "poly":
            decay = (1 - progress) ** o.poly_power
        elif o.schedule == "step":
            decay = o.gamma ** sum(progress >= m for m in o.milestones)
        else:
            decay = 1.0
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * decay

    return factor


def make_optimizer(
    cfg: TrainConfig, params: list[nn.Parameter], lr_scale: float = 1.0, weight_decay: float | None = None
) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in params if p.requires_grad]
    lr, wd = o.lr * lr_scale, o.weight_decay if weight_decay is None else weight_decay
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


def make_optimizers(cfg: TrainConfig, backbone: nn.Module, criterion: nn.Module, total_steps: int) -> tuple[list, list]:
    """[backbone's, head's] optimizers and their LR schedules. Two optimizers: a sharded head's rows
    and their state are per rank, the backbone's are not; the backbone's LR is × finetune.backbone_lr_scale,
    and L2-SP replaces its weight decay."""
    ft = cfg.finetune
    optimizers = [
        make_optimizer(cfg, list(backbone.parameters()), ft.backbone_lr_scale, 0.0 if ft.l2_sp else None),
        make_optimizer(cfg, list(criterion.parameters())),
    ]
    factor = lr_factor(cfg, total_steps)
    return optimizers, [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in optimizers]


def optimizer_step(
    cfg: TrainConfig, optimizers: list, schedulers: list, modules: list[nn.Module], head_only: bool, scaler: torch.amp.GradScaler
) -> None:
    """The end of a step, after backward: clip (each module's own norm), step (the head's optimizer
    only during a head-only warm-up), zero the gradients, advance every schedule."""
    stepped = optimizers[1:] if head_only else optimizers
    if cfg.optim.grad_clip is not None:
        for o in stepped:
            scaler.unscale_(o)
        # the sharded head's rows are disjoint per rank; the clip norm is each module's own
        for m in modules:
            nn.utils.clip_grad_norm_(m.parameters(), cfg.optim.grad_clip)
    for o in stepped:
        scaler.step(o)
    scaler.update()
    for o in optimizers:
        o.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # a head-only step leaves the backbone's optimizer unstepped, on purpose
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
        for s in schedulers:
            s.step()


class Recipe:
    """The fine-tuning options of `cfg.finetune` on one backbone: frozen stages (no gradient, eval
    mode), BatchNorm statistics frozen, L2-SP towards the initial weights, a head-only warm-up."""

    def __init__(self, cfg: TrainConfig, backbone: nn.Module) -> None:
        self.cfg = cfg.finetune
        self.frozen: list[nn.Module] = []
        if self.cfg.freeze_stages:
            all_stages = stages(backbone)
            if self.cfg.freeze_stages > len(all_stages):
                raise ValueError(f"finetune.freeze_stages={self.cfg.freeze_stages}, but {cfg.backbone} has {len(all_stages)} stages")
            self.frozen = [m for stage in all_stages[: self.cfg.freeze_stages] for m in stage]
        for module in self.frozen:
            module.requires_grad_(False)
        # L2-SP's reference: the weights the run starts from (deterministic: imported, or seeded)
        self.reference = [(p, p.detach().clone()) for p in backbone.parameters() if p.requires_grad] if self.cfg.l2_sp else []

    def set_modes(self, backbone: nn.Module, step: int) -> None:
        """After `backbone.train()`: frozen parts (all of it during the warm-up) and, with bn_eval,
        every BatchNorm go to eval mode, so their statistics stay as they are."""
        if self.head_only(step):
            backbone.eval()
            return
        for module in self.frozen:
            module.eval()
        if self.cfg.bn_eval:
            for module in backbone.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def head_only(self, step: int) -> bool:
        return step < self.cfg.head_only_steps

    def penalty(self) -> torch.Tensor | float:
        """α/2 · Σ‖w − w₀‖² over the trainable backbone weights (0 when L2-SP is off)."""
        if not self.reference:
            return 0.0
        return 0.5 * self.cfg.l2_sp * sum(((p - p0) ** 2).sum() for p, p0 in self.reference)


class Trainer:
    def __init__(self, cfg: TrainConfig, settings: Settings, env: Dist | None = None) -> None:
        """`settings` (read once by the command) locate an imported backbone's manifest and weights."""
        self.cfg, self.env = cfg, env or init_distributed()
        torch.manual_seed(cfg.seed)
        self.preprocessing = for_backbone(cfg.backbone, settings.models_dir)
        source = open_source(cfg.data.train, self.preprocessing.size)
        num_classes = cfg.data.num_classes or int(source.labels.max()) + 1
        self.val_set = None
        if cfg.data.val_fraction > 0:
            train_idx, val_idx = split_identities(source.labels, cfg.data.val_fraction, cfg.seed)
            if self.env.main:
                self.val_set = holdout_set(Subset(source, val_idx), cfg.data.val_pairs, cfg.seed)
            source = Subset(source, train_idx)
        if cfg.data.val_bin is not None and self.env.main:
            self.val_set = load_bin(cfg.data.val_bin)
        self.dataset = FaceDataset(source, cfg.data.augment, self.preprocessing)
        held_out = (
            "no validation (data.val_fraction 0)"
            if self.val_set is None
            else (f"validation: {len(self.val_set.issame)} pairs of {self.val_set.name} every {cfg.val_every} steps")
        )
        self.summary = (
            f"data: {len(source)} images of {len(set(source.labels.tolist()))} identities from {cfg.data.train}; "
            f"{held_out}; {cfg.steps} steps of {cfg.batch_size}"
        )
        self.num_classes = num_classes
        e, device = self.env, self.env.device

        backbone = build_backbone(cfg.backbone, cfg.embedding_dim, settings, **cfg.backbone_params).to(device)
        if cfg.channels_last:
            # torch's overloads of Module.to omit memory_format, which its docstring and code take
            backbone = backbone.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.recipe = Recipe(cfg, backbone)
        if cfg.head.sharded:
            start, stop = shard_range(num_classes, e.rank, e.world_size)
            torch.manual_seed(cfg.seed + 1 + e.rank)  # each shard its own initial rows
            head = build_head(cfg.head.name, cfg.embedding_dim, stop - start, **cfg.head.params)
            criterion_module: HeadLoss | ShardedHead = ShardedHead(
                head, num_classes, e.rank, e.world_size, cfg.head.sample_rate, cfg.seed
            ).to(device)
            torch.manual_seed(cfg.seed)
        else:
            if cfg.head.sample_rate < 1:
                raise ValueError("head.sample_rate < 1 (Partial FC) needs head.sharded: true")
            criterion_module = HeadLoss(build_head(cfg.head.name, cfg.embedding_dim, num_classes, **cfg.head.params)).to(device)
        self.backbone_module, self.criterion_module = backbone, criterion_module
        criterion: nn.Module = criterion_module
        if e.world_size > 1:
            ids = [device.index] if device.type == "cuda" else None
            backbone = nn.parallel.DistributedDataParallel(backbone, device_ids=ids)
            if not cfg.head.sharded:
                criterion = nn.parallel.DistributedDataParallel(criterion_module, device_ids=ids)
        self.backbone, self.criterion = backbone, criterion

        self.micro_per_epoch = len(EpochBatches(len(self.dataset), cfg.batch_size, cfg.seed, 0, e.rank, e.world_size))
        steps_per_epoch = self.micro_per_epoch // cfg.optim.accumulate
        if steps_per_epoch == 0:
            raise ValueError(f"{len(self.dataset)} samples give no full step of {cfg.batch_size}×{e.world_size}×{cfg.optim.accumulate}")
        if cfg.steps is not None:
            self.total_steps = cfg.steps
        elif cfg.epochs is not None:
            self.total_steps = cfg.epochs * steps_per_epoch
        else:  # TrainConfig's validator refuses this; a config changed after validation is not re-checked
            raise ValueError("set epochs or steps")
        self.optimizers, self.schedulers = make_optimizers(cfg, self.backbone_module, self.criterion_module, self.total_steps)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
        self.step, self.epoch, self.micro_in_epoch = 0, 0, 0
        self.best: float | None = None

    # ---- checkpoints ----

    def state(self) -> dict:
        return {
            "backbone": self.backbone_module.state_dict(),
            "head": None if self.cfg.head.sharded else self.criterion_module.head.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers[: 1 if self.cfg.head.sharded else None]],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "micro_in_epoch": self.micro_in_epoch,
            "best": self.best,
            "rng": torch.get_rng_state(),
            "num_classes": self.num_classes,
            "world_size": self.env.world_size,
            "config": self.cfg.model_dump(mode="json"),
        }

    def save(self, path: Path) -> None:
        if self.cfg.head.sharded:  # every rank writes its rows and their optimizer state
            shard = {"head": self.criterion_module.state_dict(), "optimizer": self.optimizers[-1].state_dict(), "rank": self.env.rank}
            save_checkpoint(shard, shard_path(path, self.env.rank))
        if self.env.main:
            save_checkpoint(self.state(), path)

    def load(self, path: Path) -> None:
        state = load_checkpoint(path, self.env.device)
        sharded = checkpoint_config(state).head.sharded
        if sharded != self.cfg.head.sharded or (self.cfg.head.sharded and state["world_size"] != self.env.world_size):
            raise ValueError(f"{path} was trained with another head layout (sharded over {state['world_size']} ranks)")
        self.backbone_module.load_state_dict(state["backbone"])
        if self.cfg.head.sharded:
            shard = load_checkpoint(shard_path(path, self.env.rank), self.env.device)
            self.criterion_module.load_state_dict(shard["head"])
            self.optimizers[-1].load_state_dict(shard["optimizer"])
            self.optimizers[0].load_state_dict(state["optimizers"][0])
        else:
            self.criterion_module.head.load_state_dict(state["head"])
            for o, s in zip(self.optimizers, state["optimizers"], strict=True):
                o.load_state_dict(s)
        for sched, s in zip(self.schedulers, state["schedulers"], strict=True):
            sched.load_state_dict(s)
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.micro_in_epoch = state["step"], state["epoch"], state["micro_in_epoch"]
        self.best = state["best"]
        torch.set_rng_state(state["rng"].cpu())

    # ---- the loop ----

    def _batches(self):
        """(epoch, micro-batch index, (images, labels)) from the current position on, forever."""
        cfg, e = self.cfg, self.env
        while True:
            sampler = EpochBatches(len(self.dataset), cfg.batch_size, cfg.seed, self.epoch, e.rank, e.world_size, self.micro_in_epoch)
            loader = torch.utils.data.DataLoader(
                self.dataset,
                batch_sampler=sampler,
                num_workers=cfg.data.workers,
                pin_memory=e.device.type == "cuda",
                generator=torch.Generator().manual_seed(cfg.seed),  # leaves the global RNG alone
                persistent_workers=False,
            )
            yield from enumerate(loader, start=self.micro_in_epoch)
            self.epoch, self.micro_in_epoch = self.epoch + 1, 0

    def _autocast(self):
        if self.cfg.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=torch.bfloat16 if self.cfg.amp == "bf16" else torch.float16)

    def train_step(self, micro_batches, want_stats: bool = False) -> tuple[float, dict | None]:
        """One optimizer step over `accumulate` micro-batches; returns the mean loss and, when asked,
        the last micro-batch's statistics, taken before the update (after it, the head's target rows
        have just moved towards these very embeddings)."""
        cfg, device = self.cfg, self.env.device
        head_only = self.recipe.head_only(self.step)
        self.backbone.train()
        self.recipe.set_modes(self.backbone_module, self.step)
        total = 0.0
        for k, (images, labels) in enumerate(micro_batches):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if cfg.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            last = k == cfg.optim.accumulate - 1
            sync = contextlib.nullcontext() if last or self.env.world_size == 1 else self._no_sync()
            with sync:
                with self._autocast(), torch.set_grad_enabled(not head_only):
                    embeddings = self.backbone(images)
                loss = self.criterion(embeddings.float(), labels)  # the head always runs in float32
                penalty = 0.0 if head_only else self.recipe.penalty()
                self.scaler.scale((loss + penalty) / cfg.optim.accumulate).backward()
            total += float(loss.detach())
        stats = self.criterion_module.stats(embeddings.detach(), labels) if want_stats else None
        optimizer_step(cfg, self.optimizers, self.schedulers, [self.backbone_module, self.criterion_module], head_only, self.scaler)
        self.step += 1
        return total / cfg.optim.accumulate, stats

    @contextlib.contextmanager
    def _no_sync(self):
        with contextlib.ExitStack() as stack:
            for m in (self.backbone, self.criterion):
                if isinstance(m, nn.parallel.DistributedDataParallel):
                    stack.enter_context(m.no_sync())
            yield

    def validate(self) -> float | None:
        """Rank 0 scores the validation pairs (10-fold accuracy, flip-TTA); None without a set."""
        if self.val_set is None:
            return None
        metrics = evaluate(TorchEmbedder(self.backbone_module, preprocessing=self.preprocessing), self.val_set)
        return metrics["flip"]["accuracy"]

    def run(self, resume: Path | None = None, progress: bool = True, stop_at: int | None = None) -> RunResult:
        """Train to the configured length (or to `stop_at` steps, for tests and time-boxed runs)."""
        cfg, e = self.cfg, self.env
        out = Path(cfg.output)
        if resume is not None:
            self.load(resume)
        end = min(stop_at or self.total_steps, self.total_steps)
        writer = None
        if e.main:
            from torch.utils.tensorboard import SummaryWriter

            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
            writer = SummaryWriter(str(out / "tb"), purge_step=self.step + 1 if self.step else None)
        result = RunResult(self.step, best=self.best)
        self.backbone.train()
        self.criterion.train()
        batches = self._batches()
        bar = _Progress(end, self.step, enabled=progress and e.main)
        samples = cfg.batch_size * e.world_size * cfg.optim.accumulate
        with bar:
            bar.log(self.summary)
            while self.step < end:
                micro = []
                for _ in range(cfg.optim.accumulate):
                    index, batch = next(batches)
                    micro.append(batch)
                self.micro_in_epoch = index + 1
                lr = self.optimizers[-1].param_groups[0]["lr"]  # the head's (the backbone's is × finetune.backbone_lr_scale)
                log_now = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == end
                loss, stats = self.train_step(micro, want_stats=log_now)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss} at step {self.step}; lower optim.lr or check the data")
                result.losses.append(loss)
                bar.advance(loss, samples)
                if stats is not None:  # asked for on log steps only
                    scale = head_scale(self.criterion_module.head)
                    if writer is not None:
                        writer.add_scalar("train/loss", loss, self.step)
                        writer.add_scalar("train/lr", lr, self.step)
                        writer.add_scalar("train/accuracy", stats["accuracy"], self.step)
                        writer.add_scalar("train/feature_norm", stats["feature_norm"], self.step)
                        writer.add_scalar("train/theta_y_deg", stats["theta_y"], self.step)
                        writer.add_scalar("train/samples_per_s", bar.rate, self.step)
                        if scale is not None:
                            writer.add_scalar("train/head_scale", scale, self.step)
                        bar.log(
                            f"step {self.step}/{end} loss {loss:.4f} lr {lr:.4g} acc {stats['accuracy']:.3f} "
                            f"θy {stats['theta_y']:.1f}° ‖x‖ {stats['feature_norm']:.2f} {bar.rate:.1f} "
                            f"samples/s, ETA {bar.eta(end - self.step)}"
                        )
                if cfg.val_every and self.step % cfg.val_every == 0 or self.step == end:
                    accuracy = self._validate_and_keep_best(writer, out)
                    if accuracy is not None:
                        bar.log(f"step {self.step}/{end} validation accuracy {accuracy:.4f} (best {self.best:.4f})")
                if self.step % cfg.checkpoint_every == 0 or self.step == end:
                    self.save(out / "last.pt")
                    if self.step % cfg.checkpoint_every == 0:
                        self.save(out / f"step-{self.step:08d}.pt")
                        self._prune(out)
        if writer is not None:
            writer.close()
        result.step, result.best = self.step, self.best
        return result

    def _validate_and_keep_best(self, writer, out: Path) -> float | None:
        accuracy = self.validate() if self.env.main else None
        if self.env.world_size > 1:
            shared = [accuracy]
            dist.broadcast_object_list(shared, src=0)
            accuracy = shared[0]
        if accuracy is None:
            return None
        if writer is not None:
            writer.add_scalar("val/accuracy", accuracy, self.step)
            writer.flush()
        if self.best is None or accuracy > self.best:
            self.best = accuracy
            self.save(out / "best.pt")
        return accuracy

    def _prune(self, out: Path) -> None:
        if not self.env.main:
            return
        periodic = sorted(out.glob("step-*.pt"))
        periodic = [p for p in periodic if ".head" not in p.name]
        for old in periodic[: -self.cfg.keep_checkpoints]:
            for p in [old, *old.parent.glob(f"{old.stem}.head*.pt")]:
                p.unlink(missing_ok=True)


class _Progress:
    """A rich progress line (step, loss, samples/s, ETA) that also prints periodic log lines."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.enabled, self.rate = enabled, 0.0
        self._t0, self._n, self._steps = time.perf_counter(), 0, 0
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]:.4f}"),
                TextColumn("{task.fields[rate]:.1f} samples/s"),
                TimeRemainingColumn(),
            )
            self.task = self.progress.add_task("train", total=total, completed=done, loss=float("nan"), rate=0.0)

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def eta(self, steps_left: int) -> str:
        """Time left at the steps/s measured so far in this run."""
        elapsed = time.perf_counter() - self._t0
        seconds = round(steps_left * elapsed / self._steps) if self._steps else 0
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def advance(self, loss: float, samples: int) -> None:
        self._steps += 1
        self._n += samples
        self.rate = self._n / max(time.perf_counter() - self._t0, 1e-9)
        if self.enabled:
            self.progress.update(self.task, advance=1, loss=loss, rate=self.rate)

    def log(self, line: str) -> None:
        if self.enabled:
            self.progress.console.print(line)


def train(cfg: TrainConfig, settings: Settings, resume: Path | None = None, progress: bool = True, stop_at: int | None = None) -> RunResult:
    return Trainer(cfg, settings).run(resume=resume, progress=progress, stop_at=stop_at)
