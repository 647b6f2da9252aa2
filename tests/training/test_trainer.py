"""The training loop on tiny synthetic data: loss goes down for two heads, resume is exact,
checkpoints load with weights_only, the config refuses mistakes."""

from __future__ import annotations

import pytest
import torch

from service.core.settings import get_settings
from tests.training.tiny import tiny_config, write_aligned_folders
from training.checkpoint import load_checkpoint
from training.config import load_config
from training.trainer import Trainer, lr_factor

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_aligned_folders(tmp_path_factory.mktemp("aligned"))


@pytest.mark.parametrize("head", [("arcface", {"s": 16.0, "m": 0.2}), ("cosface", {"s": 16.0, "m": 0.2})])
def test_loss_goes_down(data, tmp_path, head):
    name, params = head
    cfg = tiny_config(data, tmp_path / name, head={"name": name, "params": params})
    result = Trainer(cfg, get_settings()).run(progress=False)
    assert len(result.losses) == 6
    assert sum(result.losses[-2:]) / 2 < 0.6 * sum(result.losses[:2]) / 2, result.losses
    state = load_checkpoint(tmp_path / name / "last.pt")
    assert state["step"] == 6 and state["config"]["head"]["name"] == name
    assert (tmp_path / name / "tb").is_dir()


def test_resume_gives_the_same_next_step(data, tmp_path):
    """3 steps straight vs 2 steps, stop, resume from last.pt, 1 step: the same third loss, bit for bit."""
    straight = Trainer(tiny_config(data, tmp_path / "a", steps=3), get_settings()).run(progress=False)
    first = Trainer(tiny_config(data, tmp_path / "b", steps=3), get_settings()).run(progress=False, stop_at=2)
    assert first.step == 2 and first.losses == straight.losses[:2]
    resumed = Trainer(tiny_config(data, tmp_path / "b", steps=3), get_settings()).run(resume=tmp_path / "b" / "last.pt", progress=False)
    assert resumed.losses == straight.losses[2:]
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    for key, value in a["backbone"].items():
        assert torch.equal(value, b["backbone"][key]), key


def test_gradient_accumulation_and_validation(data, tmp_path):
    cfg = tiny_config(
        data, tmp_path, steps=2, batch_size=4, optim={"accumulate": 2}, data={"val_fraction": 0.5, "val_pairs": 20, "workers": 0}
    )
    trainer = Trainer(cfg, get_settings())
    assert trainer.val_set is not None
    trained = set(trainer.dataset.source.labels.tolist())
    assert len(trained) == 2  # two of four identities held out for validation pairs, never trained on
    result = trainer.run(progress=False)
    assert result.step == 2 and result.best is not None and 0 <= result.best <= 1
    assert (tmp_path / "best.pt").is_file()


def test_warmup_then_cosine():
    cfg = load_config(None, ["steps=100", "optim.warmup_steps=10", "optim.schedule=cosine", "data.train=x"])
    f = lr_factor(cfg, 100)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)


def test_config_overrides_and_errors():
    cfg = load_config(None, ["data.train=/d", "epochs=2", "optim.lr=0.05", "head.params={s: 30}"])
    assert cfg.optim.lr == 0.05 and cfg.head.params == {"s": 30} and cfg.epochs == 2
    with pytest.raises(ValueError, match="epochs or steps"):
        load_config(None, ["data.train=/d"])
    with pytest.raises(ValueError, match="extra"):
        load_config(None, ["data.train=/d", "steps=1", "optim.lrr=0.1"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["steps"])


def test_partial_fc_needs_sharded_head(data, tmp_path):
    with pytest.raises(ValueError, match="sharded"):
        Trainer(tiny_config(data, tmp_path, head={"sample_rate": 0.5}), get_settings())


def test_the_log_says_what_it_trains_on_each_validation_and_the_time_left(data, tmp_path, capsys):
    cfg = tiny_config(data, tmp_path, steps=2, log_every=1, val_every=1, data={"val_fraction": 0.5, "val_pairs": 20, "workers": 0})
    Trainer(cfg, get_settings()).run(progress=True)
    out = " ".join(capsys.readouterr().out.split())
    assert "data: 8 images of 2 identities" in out and "validation: 20 pairs" in out
    assert "step 1/2 validation accuracy" in out and "step 2/2 validation accuracy" in out
    assert "ETA 0:00:" in out
