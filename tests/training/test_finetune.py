"""Fine-tuning recipe options (`finetune:` in the config) on tiny synthetic data: frozen stages keep
their weights and BatchNorm statistics, bn_eval freezes every statistic, L2-SP starts at zero and
grows, the backbone's LR is scaled, a head-only warm-up leaves the backbone as it was."""

from __future__ import annotations

import pytest
import torch

from service.core.settings import get_settings
from tests.training.tiny import tiny_config, write_aligned_folders
from training.backbones import stages
from training.trainer import Trainer

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_aligned_folders(tmp_path_factory.mktemp("aligned"))


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _stage_keys(trainer: Trainer, first: int) -> set[str]:
    """state_dict keys (parameters and buffers) of the first `first` stages."""
    owned = {id(m) for stage in stages(trainer.backbone_module)[:first] for m in stage}
    keys = set()
    for name, module in trainer.backbone_module.named_modules():
        if id(module) in owned:
            keys |= {f"{name}.{k}" for k in module.state_dict()}
    return keys


def _changed(before: dict, after: dict, keys) -> set[str]:
    return {k for k in keys if not torch.equal(before[k], after[k])}


def test_frozen_stages_keep_weights_and_statistics(data, tmp_path):
    trainer = Trainer(tiny_config(data, tmp_path, steps=4, finetune={"freeze_stages": 2}), get_settings())
    before = _snapshot(trainer.backbone_module)
    result = trainer.run(progress=False)
    after = _snapshot(trainer.backbone_module)
    frozen = _stage_keys(trainer, 2)
    assert frozen and any("running_mean" in k for k in frozen)
    assert not _changed(before, after, frozen)
    assert _changed(before, after, set(before) - frozen)  # the rest learned
    assert result.losses[-1] < result.losses[0]


def test_bn_eval_freezes_every_statistic(data, tmp_path):
    def run(bn_eval: bool) -> set[str]:
        trainer = Trainer(tiny_config(data, tmp_path / str(bn_eval), steps=2, finetune={"bn_eval": bn_eval}), get_settings())
        before = _snapshot(trainer.backbone_module)
        trainer.run(progress=False)
        return _changed(before, _snapshot(trainer.backbone_module), before)

    stats = lambda keys: {k for k in keys if k.endswith(("running_mean", "running_var"))}  # noqa: E731
    changed_eval, changed_train = run(True), run(False)
    assert stats(changed_train)  # in train mode the statistics move: the check can fail
    assert not stats(changed_eval) and changed_eval  # in eval mode only the weights learn


def test_l2_sp_is_zero_at_the_start_and_grows(data, tmp_path):
    trainer = Trainer(tiny_config(data, tmp_path, steps=3, finetune={"l2_sp": 0.01}), get_settings())
    assert float(trainer.recipe.penalty().detach()) == 0.0
    assert trainer.optimizers[0].param_groups[0]["weight_decay"] == 0.0  # L2-SP replaces plain decay
    assert trainer.optimizers[1].param_groups[0]["weight_decay"] == trainer.cfg.optim.weight_decay
    trainer.run(progress=False)
    grown = float(trainer.recipe.penalty().detach())
    assert grown > 0
    p, p0 = trainer.recipe.reference[0]
    assert not torch.equal(p, p0)  # the reference is the start, not a live copy
    assert Trainer(tiny_config(data, tmp_path / "off", steps=1), get_settings()).recipe.penalty() == 0.0


def test_backbone_lr_is_scaled(data, tmp_path):
    trainer = Trainer(tiny_config(data, tmp_path, finetune={"backbone_lr_scale": 0.1}), get_settings())
    backbone_lr, head_lr = (o.param_groups[0]["lr"] for o in trainer.optimizers)
    assert backbone_lr == pytest.approx(0.1 * head_lr) and head_lr == pytest.approx(trainer.cfg.optim.lr)


def test_head_only_warmup_leaves_the_backbone_alone(data, tmp_path):
    trainer = Trainer(tiny_config(data, tmp_path, steps=4, finetune={"head_only_steps": 2}), get_settings())
    before, head_before = _snapshot(trainer.backbone_module), _snapshot(trainer.criterion_module)
    trainer.run(progress=False, stop_at=2)
    assert not _changed(before, _snapshot(trainer.backbone_module), before)
    assert _changed(head_before, _snapshot(trainer.criterion_module), head_before)
    trainer.run(resume=tmp_path / "last.pt", progress=False)  # steps 3 and 4 train the backbone too
    assert _changed(before, _snapshot(trainer.backbone_module), before)


def test_recipe_together_lowers_the_loss(data, tmp_path):
    cfg = tiny_config(
        data,
        tmp_path,
        steps=12,
        optim={"lr": 0.05},
        finetune={"freeze_stages": 1, "backbone_lr_scale": 0.5, "bn_eval": True, "l2_sp": 1e-3, "head_only_steps": 2},
    )
    losses = Trainer(cfg, get_settings()).run(progress=False).losses
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses


def test_freezing_more_stages_than_there_are_is_refused(data, tmp_path):
    with pytest.raises(ValueError, match="stages"):
        Trainer(tiny_config(data, tmp_path, finetune={"freeze_stages": 99}), get_settings())
