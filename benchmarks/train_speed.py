"""Training throughput (samples/s) of mobilefacenet and iresnet50 at batch 64: one full optimizer
step — backbone forward and backward, an ArcFace head over 3,441 identities (our small set), SGD.

    python benchmarks/train_speed.py [--steps 3] [--batch 64] [--backbones mobilefacenet iresnet50]

On CPU it runs float32, NCHW and channels-last; on a GPU also bf16 autocast with channels-last.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from training.backbones import build_backbone
from training.heads import build_head
from training.heads.loss import HeadLoss


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(name: str, batch: int, steps: int, device: torch.device, channels_last: bool, amp: torch.dtype | None) -> float:
    torch.manual_seed(0)
    backbone = build_backbone(name, 512).to(device)
    criterion = HeadLoss(build_head("arcface", 512, 3441)).to(device)
    if channels_last:
        backbone = backbone.to(memory_format=torch.channels_last)
    params = list(backbone.parameters()) + list(criterion.parameters())
    optimizer = torch.optim.SGD([p for p in params if p.requires_grad], lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, 112, 112, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 3441, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            embeddings = backbone(x)
        loss = criterion(embeddings.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocator, kernels, cuDNN autotuning
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbones", nargs="+", default=["mobilefacenet", "iresnet50"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}")
    print(f"torch {torch.__version__}, python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    runs = [("cpu", "fp32 NCHW", False, None), ("cpu", "fp32 channels-last", True, None)]
    if torch.cuda.is_available():
        print(f"gpu: {torch.cuda.get_device_name()}")
        runs += [("cuda", "fp32 channels-last", True, None), ("cuda", "bf16 AMP channels-last", True, torch.bfloat16)]
    print(f"{'backbone':<14} {'device':<6} {'mode':<24} {'samples/s':>10}   (batch {args.batch}, {args.steps} timed steps)")
    for name in args.backbones:
        for device, mode, channels_last, amp in runs:
            rate = measure(name, args.batch, args.steps, torch.device(device), channels_last, amp)
            print(f"{name:<14} {device:<6} {mode:<24} {rate:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
