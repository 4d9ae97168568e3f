"""FiLM-conditioned image encoder trained from scratch (RT-1 / GeRM's vision trunk, seed 003 §IV-C).

RT-1 runs an ImageNet EfficientNet-B3 with a FiLM layer after every MBConv block, conditioned on the
instruction's sentence embedding e:

    FiLM(x, e) = (1 + γ(e)) ⊙ x + β(e)          γ, β: linear projections of e, ONE value per channel

γ and β start at exactly zero, so at initialisation every FiLM layer is the identity and the trunk is
the plain image network (that is what let RT-1 keep its pretrained weights; here it keeps the early
training of a from-scratch network free of a random language modulation).

No pretrained image network can be downloaded on this machine, so the trunk is a small EfficientNet-style
stack trained from scratch at the task's camera resolution (64² by default):

    stem: 3×3 conv stride 2 → BatchNorm → SiLU                                 (N, C0, H/2, W/2)
    per stage s: MBConv(stride s) → FiLM, repeated; an MBConv block is
        1×1 expand (×r) → BN → SiLU → 3×3 depthwise (stride s) → BN → SiLU
        → squeeze-excitation → 1×1 project → BN  (+ input when stride 1 and widths agree)
    head: 1×1 conv to d_model                                                  (N, D, h, w)

BatchNorm as in EfficientNet, and deliberately not a per-sample norm: GroupNorm/LayerNorm after a FiLM
layer re-normalise each sample's channels and so cancel most of the per-sample scale and shift the
instruction applied (measured on the colour task with FiLM as the only language path: GroupNorm stayed
at chance for 1000 steps, BatchNorm moved off it within ~300). Padding frames are never encoded, so they never enter the
batch statistics; acting uses the running statistics (eval mode).

Small-data from-scratch encoders over-fit without augmentation; ``random_shift`` is DrQ's fix: pad by
``pad`` pixels (edge replicate) and crop back at a random offset, one offset per window so all frames of
a sample move together (the motion between frames stays the real one).

``random_colour_jitter`` widens the colours the trunk sees: per window one hue rotation (about the grey
axis of RGB), one saturation and one brightness factor and one tint toward white, the same for all its
frames. QUARD's held-out colours are unseen hues and shades of the training ones (gold a dark yellow,
pink a pale red, orange between red and yellow, purple a reddish blue); without it the trunk has met
four object colours only. Measured on QUARD it lowers held-out success (docs/vla.md, rows J, K, K2).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.tensors import device_constant, from_host


@dataclass
class ImageEncoderConfig:
    image_size: tuple[int, int] = (64, 64)     # (H, W) the camera renders; the trunk is fully convolutional
    stem_channels: int = 16
    # (out channels, stride, repeats) per stage; at 64² the default gives an 8×8 map = 64 tokens/frame
    stages: tuple[tuple[int, int, int], ...] = ((24, 2, 1), (32, 2, 1), (48, 1, 1))
    expand_ratio: int = 4
    se_ratio: float = 0.25
    out_channels: int = 128                    # = d_model of the token front-end
    cond_dim: int = 128                        # width of the instruction embedding FiLM reads

    def validate(self) -> None:
        h, w = self.image_size
        if h < 8 or w < 8:
            raise ValueError(f"image_size must be at least 8x8, got {self.image_size}")
        for name in ("stem_channels", "expand_ratio", "out_channels", "cond_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"image encoder {name}={getattr(self, name)}; must be >= 1")
        if not self.stages:
            raise ValueError("image encoder needs at least one stage")
        for st in self.stages:
            if len(st) != 3 or min(st) < 1:
                raise ValueError(f"image encoder stage {st} must be (channels >= 1, stride >= 1, repeats >= 1)")

    def feature_size(self) -> tuple[int, int]:
        """(h, w) of the output map: stride 2 in the stem, then each stage's stride (conv arithmetic
        with padding 1, kernel 3)."""
        h, w = self.image_size
        for s in [2] + [st[1] for st in self.stages]:
            h, w = (h - 1) // s + 1, (w - 1) // s + 1
        return h, w

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ImageEncoderConfig":
        d = dict(d)
        d["image_size"] = tuple(d.get("image_size", (64, 64)))
        d["stages"] = tuple(tuple(s) for s in d.get("stages", cls.stages))
        return cls(**d)


def _norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels)


class FiLM(nn.Module):
    """x (N, C, h, w), e (N, E) -> (1 + γ(e)) ⊙ x + β(e), γ and β zero-initialised (identity at init)."""

    def __init__(self, cond_dim: int, channels: int):
        super().__init__()
        self.gamma = nn.Linear(cond_dim, channels)
        self.beta = nn.Linear(cond_dim, channels)
        for p in (self.gamma.weight, self.gamma.bias, self.beta.weight, self.beta.bias):
            nn.init.zeros_(p)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        gamma = self.gamma(e)[:, :, None, None]                     # (N, C, 1, 1)
        beta = self.beta(e)[:, :, None, None]                       # (N, C, 1, 1)
        return (1.0 + gamma) * x + beta


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3), keepdim=True)                         # (N, C, 1, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """EfficientNet's inverted residual block (expand → depthwise → SE → project)."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand_ratio: int, se_ratio: float):
        super().__init__()
        hidden = c_in * expand_ratio
        self.expand = nn.Sequential(nn.Conv2d(c_in, hidden, 1, bias=False), _norm(hidden), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                                       _norm(hidden), nn.SiLU())
        self.se = SqueezeExcite(hidden, max(1, int(c_in * se_ratio)))
        self.project = nn.Sequential(nn.Conv2d(hidden, c_out, 1, bias=False), _norm(c_out))
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class FiLMImageEncoder(nn.Module):
    """images (N, 3, H, W) float in [0, 1], instruction embedding e (N, E) -> feature map (N, D, h, w)."""

    def __init__(self, cfg: ImageEncoderConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.stem = nn.Sequential(nn.Conv2d(3, cfg.stem_channels, 3, 2, 1, bias=False),
                                  _norm(cfg.stem_channels), nn.SiLU())
        blocks, films = [], []
        c = cfg.stem_channels
        for c_out, stride, repeats in cfg.stages:
            for r in range(repeats):
                blocks.append(MBConv(c, c_out, stride if r == 0 else 1, cfg.expand_ratio, cfg.se_ratio))
                films.append(FiLM(cfg.cond_dim, c_out))
                c = c_out
        self.blocks, self.films = nn.ModuleList(blocks), nn.ModuleList(films)
        self.head = nn.Conv2d(c, cfg.out_channels, 1)
        # fixed input normalisation: uint8/255 has mean ~0.5 (the stem's BN then learns the rest)
        self.register_buffer("pixel_mean", torch.full((1, 3, 1, 1), 0.5), persistent=False)
        self.register_buffer("pixel_std", torch.full((1, 3, 1, 1), 0.25), persistent=False)

    def forward(self, images: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        x = self.stem((images - self.pixel_mean) / self.pixel_std)   # (N, C0, H/2, W/2)
        for block, film in zip(self.blocks, self.films):
            x = film(block(x), e)                                     # FiLM after every MBConv (RT-1)
        return self.head(x)                                           # (N, D, h, w)


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ augmentation: images (B, T, C, H, W) -> the same shape, each sample shifted by one random
    integer offset in [-pad, pad]² (edge pixels replicated), identical for all T frames of a sample."""
    if pad <= 0:
        return images
    b, t, c, h, w = images.shape
    x = F.pad(images.reshape(b, t * c, h, w), (pad, pad, pad, pad), mode="replicate")
    # drawn on the host (the CPU generator's stream on any device), sent without waiting for the GPU
    dy = from_host(torch.randint(0, 2 * pad + 1, (b,), generator=generator, device="cpu"), images.device)
    dx = from_host(torch.randint(0, 2 * pad + 1, (b,), generator=generator, device="cpu"), images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device)[None])       # (B, H)
    cols = (dx[:, None] + torch.arange(w, device=images.device)[None])       # (B, W)
    x = x.gather(2, rows[:, None, :, None].expand(b, t * c, h, w + 2 * pad))  # (B, TC, H, W+2p)
    x = x.gather(3, cols[:, None, None, :].expand(b, t * c, h, w))           # (B, TC, H, W)
    return x.reshape(b, t, c, h, w)


def hue_rotation(angle: torch.Tensor) -> torch.Tensor:
    """(B,) angles in radians -> (B, 3, 3) rotations of RGB about the grey axis k = (1, 1, 1)/√3
    (Rodrigues: R = cos θ I + sin θ [k]x + (1 - cos θ) k kᵀ); grey stays grey, a hue turns by θ."""
    c, s = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    k = torch.full((3,), 3 ** -0.5, dtype=angle.dtype, device=angle.device)
    cross = device_constant(((0.0, -1.0, 1.0), (1.0, 0.0, -1.0), (-1.0, 1.0, 0.0)),
                            angle.dtype, angle.device) * 3 ** -0.5               # [k]x
    eye = torch.eye(3, dtype=angle.dtype, device=angle.device)
    return c * eye + s * cross + (1 - c) * torch.outer(k, k)


def random_colour_jitter(images: torch.Tensor, hue_deg: float, saturation: float, brightness: float,
                         tint: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Images (B, T, 3, H, W) in [0, 1] -> the same shape, each sample's frames turned by one hue angle in
    [-hue_deg, hue_deg] degrees, their saturation scaled by one factor in [1 - saturation, 1 + saturation]
    (toward or away from the pixel's grey), their brightness by one in [1 - brightness, 1 + brightness],
    and mixed toward white by one share in [0, tint] (a tint: red toward pink); clipped to [0, 1].
    All 0: the images unchanged."""
    if hue_deg <= 0 and saturation <= 0 and brightness <= 0 and tint <= 0:
        return images
    b = images.shape[0]

    def factor(spread: float) -> torch.Tensor:   # one uniform draw per sample in [-spread, spread]
        u = from_host(torch.rand(b, generator=generator, device="cpu"), images.device).to(images.dtype)
        return (2 * u - 1) * spread

    rot = hue_rotation(factor(hue_deg) * (torch.pi / 180.0))                    # (B, 3, 3)
    x = torch.einsum("bij,btjhw->btihw", rot, images)
    grey = x.mean(dim=2, keepdim=True)
    x = grey + (x - grey) * (1 + factor(saturation)).view(b, 1, 1, 1, 1)
    x = x * (1 + factor(brightness)).view(b, 1, 1, 1, 1)
    white = (factor(tint).abs()).view(b, 1, 1, 1, 1)   # |U(-t, t)| is U(0, t)
    x = x + white * (1 - x)
    return x.clamp(0.0, 1.0)


__all__ = ["FiLM", "FiLMImageEncoder", "ImageEncoderConfig", "MBConv", "hue_rotation", "random_colour_jitter",
           "random_shift"]
