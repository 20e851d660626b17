"""A small text-conditioned flow-matching transformer (DiT-style) and its loss.

Images (here: pixels, any bucket resolution) are cut into patches; each block has
self-attention over image tokens, cross-attention to the text latents (key padding from
the attention mask) and an MLP, all modulated (adaLN) by the timestep embedding. Training
follows rectified flow: ``x_t = (1 - t) x_0 + t ε`` and the model predicts the velocity
``ε - x_0``; ``t`` is drawn from a logit-normal distribution.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Size of the transformer."""

    text_dim: int
    channels: int = 3
    patch: int = 4
    dim: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form (stored in checkpoints)."""
        return asdict(self)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of ``t`` in [0, 1] (scaled by 1000)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def pos_embedding_2d(h: int, w: int, dim: int, device: torch.device) -> torch.Tensor:
    """2-D sin-cos position embedding for an ``h`` x ``w`` patch grid -> ``[h*w, dim]``."""
    quarter = dim // 4
    omega = 1.0 / (10000 ** (torch.arange(quarter, device=device, dtype=torch.float32) / quarter))
    ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                            torch.arange(w, device=device, dtype=torch.float32), indexing="ij")
    out = [torch.sin(ys.flatten()[:, None] * omega), torch.cos(ys.flatten()[:, None] * omega),
           torch.sin(xs.flatten()[:, None] * omega), torch.cos(xs.flatten()[:, None] * omega)]
    emb = torch.cat(out, dim=1)
    return nn.functional.pad(emb, (0, dim - emb.shape[1]))


class Block(nn.Module):
    """Self-attention, cross-attention to text, MLP; adaLN-modulated by the timestep."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.cross = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x: torch.Tensor, text: torch.Tensor, text_pad: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``x`` [B, N, D] image tokens, ``text`` [B, L, D], ``text_pad`` [B, L] True at padding, ``c`` [B, D]."""
        s1, g1, s2, g2, s3, g3 = self.ada(c).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + s1) + g1
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x) * (1 + s2) + g2
        x = x + self.cross(h, text, text, key_padding_mask=text_pad, need_weights=False)[0]
        h = self.norm3(x) * (1 + s3) + g3
        return x + self.mlp(h)


class FlowTransformer(nn.Module):
    """Predicts the flow velocity of noisy images given timesteps and text latents."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        p = cfg.patch
        self.patch_in = nn.Linear(cfg.channels * p * p, cfg.dim)
        self.text_in = nn.Sequential(nn.LayerNorm(cfg.text_dim), nn.Linear(cfg.text_dim, cfg.dim))
        self.null_text = nn.Parameter(torch.zeros(1, 1, cfg.dim))  # keeps attention defined for empty captions
        self.t_mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.out = nn.Linear(cfg.dim, cfg.channels * p * p)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` [B, C, H, W], ``t`` [B], ``text`` [B, L, text_dim], ``mask`` [B, L] (True = token)."""
        b, c, h, w = x.shape
        p = self.cfg.patch
        gh, gw = h // p, w // p
        tokens = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
        tokens = self.patch_in(tokens) + pos_embedding_2d(gh, gw, self.cfg.dim, x.device)
        txt = torch.cat([self.null_text.expand(b, 1, -1), self.text_in(text)], dim=1)
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=x.device), ~mask.bool()], dim=1)
        cond = self.t_mlp(timestep_embedding(t, self.cfg.dim))
        for blk in self.blocks:
            tokens = blk(tokens, txt, pad, cond)
        out = self.out(self.norm_out(tokens))
        return out.reshape(b, gh, gw, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def flow_matching_loss(model: nn.Module, x0: torch.Tensor, text: torch.Tensor, mask: torch.Tensor,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Rectified-flow loss: MSE between predicted and true velocity ``ε - x_0``."""
    b = x0.shape[0]
    t = torch.sigmoid(torch.randn(b, device=x0.device, generator=generator))
    noise = torch.randn(x0.shape, device=x0.device, generator=generator)
    xt = (1 - t.view(b, 1, 1, 1)) * x0 + t.view(b, 1, 1, 1) * noise
    pred = model(xt, t, text, mask)
    return nn.functional.mse_loss(pred.float(), (noise - x0).float())


def training_flops(cfg: ModelConfig, image_tokens: int, text_tokens: int, attention_scores: bool = True) -> float:
    """Matmul FLOPs of one training step for one sample: forward (2 per multiply-add) plus backward
    (twice the forward), the convention model FLOPs utilisation (MFU) is measured against. The text
    encoder is not counted (frozen, inference only), nor are norms and activations.

    ``image_tokens`` = patches of the sample, ``text_tokens`` = caption tokens (the null token is added here);
    ``attention_scores=False`` leaves out the attention products (``QK^T`` and the weighted values).
    """
    d, n, lt = cfg.dim, image_tokens, text_tokens + 1
    hidden = int(d * cfg.mlp_ratio)
    pixel = cfg.channels * cfg.patch ** 2
    forward = 2 * (n * pixel * d + text_tokens * cfg.text_dim * d + 2 * d * d)  # patch_in, text_in, t_mlp
    scores = 2 * n * n * d + 2 * n * lt * d if attention_scores else 0  # self and cross: QK^T, then values
    per_block = (d * 6 * d                                  # adaLN
                 + n * d * 3 * d + n * d * d                # self-attention projections
                 + n * d * d + lt * d * 2 * d + n * d * d   # cross-attention projections
                 + scores + 2 * n * d * hidden)             # MLP
    forward += 2 * cfg.depth * per_block + 2 * n * d * pixel  # blocks, out
    return 3.0 * forward


#: Peak dense bf16 tensor throughput (TFLOP/s, no sparsity) by GPU name, from the vendors' datasheets;
#: ``--peak-tflops`` overrides it, and MFU is not reported for a device not listed.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "B200": 2250.0, "A100": 312.0, "L40S": 362.05, "A10G": 70.0}


def peak_tflops(device_name: str) -> float | None:
    """The peak dense bf16 TFLOP/s of a device by its name (``torch.cuda.get_device_name``), if known.

    >>> peak_tflops("NVIDIA H200")
    989.4
    >>> peak_tflops("cpu") is None
    True
    """
    upper = device_name.upper()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in upper), None)
