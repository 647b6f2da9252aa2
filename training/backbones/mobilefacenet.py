"""MobileFaceNet (Chen et al. 2018) as arcface_torch's `mbf`: depthwise-separable bottlenecks and a
global depthwise conv (GDC) head instead of global average pooling, which keeps the spatial
weighting a face embedding needs."""

from __future__ import annotations

from torch import Tensor, nn


class ConvBlock(nn.Sequential):
    def __init__(self, in_c: int, out_c: int, kernel: int = 1, stride: int = 1, padding: int = 0, groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_c),
            nn.PReLU(out_c),
        )


class LinearBlock(nn.Sequential):
    def __init__(self, in_c: int, out_c: int, kernel: int = 1, stride: int = 1, padding: int = 0, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False), nn.BatchNorm2d(out_c))


class DepthWise(nn.Module):
    """1×1 expand → 3×3 depthwise (stride) → 1×1 linear projection, residual when shapes allow."""

    def __init__(self, in_c: int, out_c: int, groups: int, stride: int = 1, residual: bool = False) -> None:
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvBlock(in_c, groups),
            ConvBlock(groups, groups, 3, stride, 1, groups=groups),
            LinearBlock(groups, out_c),
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(x)
        return x + out if self.residual else out


def residual(channels: int, blocks: int, groups: int) -> nn.Sequential:
    return nn.Sequential(*(DepthWise(channels, channels, groups, residual=True) for _ in range(blocks)))


class MobileFaceNet(nn.Module):
    """`blocks` and `scale` as arcface_torch's get_mbf (defaults = its `mbf`); `width` multiplies every
    channel count (1.0 = arcface_torch's layout; tests use a narrow net to stay fast on a CPU).

    `downsample` > 1 average-pools the 112×112 input first, so every layer runs at 112/downsample:
    downsample 2 costs a quarter of the FLOPs, which is what lets a CPU train and serve it. The input
    and the alignment stay the service's 112×112, so the model is a drop-in for the full-size one."""

    def __init__(
        self,
        embedding_dim: int = 512,
        blocks: tuple[int, int, int, int] = (1, 4, 6, 2),
        scale: int = 2,
        width: float = 1.0,
        downsample: int = 1,
    ) -> None:
        super().__init__()

        def ch(n: int) -> int:
            return max(8, int(round(n * width / 8)) * 8)

        c64, c128, g64, g128, g256, g512, top = (ch(n) for n in (64 * scale, 128 * scale, 64, 128, 256, 512, 512))
        side = 112 // downsample
        for _ in range(4):  # four stride-2 3×3 convs with padding 1: ceil(side / 2) each
            side = (side + 1) // 2
        self.layers = nn.Sequential(
            *([nn.AvgPool2d(downsample)] if downsample > 1 else []),
            ConvBlock(3, c64, 3, 2, 1),
            ConvBlock(c64, c64, 3, 1, 1, groups=g64) if blocks[0] == 1 else residual(c64, blocks[0], g128),
            DepthWise(c64, c64, groups=g128, stride=2),
            residual(c64, blocks[1], g128),
            DepthWise(c64, c128, groups=g256, stride=2),
            residual(c128, blocks[2], g256),
            DepthWise(c128, c128, groups=g512, stride=2),
            residual(c128, blocks[3], g256),
            ConvBlock(c128, top),
        )
        # GDC: a depthwise conv as large as the final map (7×7 at 112) weights each of its positions,
        # then a linear projection.
        self.features = nn.Sequential(
            LinearBlock(top, top, side, 1, 0, groups=top),
            nn.Flatten(),
            nn.Linear(top, embedding_dim, bias=False),
            nn.BatchNorm1d(embedding_dim),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.features(self.layers(x))
