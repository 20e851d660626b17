"""Patch embeddings as one matrix product instead of a 3-D convolution.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL embed image patches with an ``nn.Conv3d`` whose kernel equals
its stride and its input (each patch is one window), which is a linear projection of the
flattened patch. cuDNN handles that convolution badly on several torch/cuDNN/GPU combinations
(pytorch/pytorch#174051, huggingface/transformers#45750: 10x to 50,000x slower than the
equivalent GEMM), and on the H200 run of ``bench/gpu.py`` a caption batch whose shapes were new
cost several seconds more than the same batch again: every Qwen3-VL batch has new shapes, since
the images' patches are concatenated (that this convolution was the cause is likely, not yet
measured: ``bench/gpu.py`` reports ``first_pass`` beside the warm sides for that). vLLM, SGLang
and transformers' optional ``patch_embeddings`` fusion make the same substitution.

:func:`linearize_patch_convs` swaps each such convolution of a loaded model for
:class:`PatchLinear`, which keeps the same parameters (names, shapes and storage: the state dict
is unchanged) and computes ``x.flatten(1) @ W.flatten(1).T + b``. The sum runs in another order,
so results match the convolution to rounding, not bit for bit.
"""

from __future__ import annotations

from typing import Any


def _is_patch_conv(module: Any) -> bool:
    """A ``Conv3d`` whose windows do not overlap and are not padded, dilated or grouped."""
    import torch.nn as nn

    return (isinstance(module, nn.Conv3d) and tuple(module.kernel_size) == tuple(module.stride)
            and not isinstance(module.padding, str) and all(p == 0 for p in module.padding)
            and all(d == 1 for d in module.dilation) and module.groups == 1)


def _patch_linear_class() -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class PatchLinear(nn.Module):
        """A kernel-equals-stride ``Conv3d`` on one-window inputs, computed as a linear layer.

        Inputs larger than one window (several output positions) go through the convolution,
        so the module is a drop-in for any input the convolution accepts."""

        def __init__(self, conv: nn.Conv3d) -> None:
            super().__init__()
            self.weight = conv.weight
            self.bias = conv.bias
            self.kernel_size = tuple(conv.kernel_size)
            self.out_channels = conv.out_channels

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if tuple(x.shape[2:]) != self.kernel_size:
                return F.conv3d(x, self.weight, self.bias, stride=self.kernel_size)
            out = F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.out_channels, -1), self.bias)
            return out.view(x.shape[0], self.out_channels, 1, 1, 1)

    return PatchLinear


def linearize_patch_convs(model: Any) -> int:
    """Replace every kernel-equals-stride ``Conv3d`` of ``model`` by a :class:`PatchLinear` on the
    same parameters; returns how many were replaced (0 for models without one)."""
    cls = None
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_patch_conv(child):
                cls = cls or _patch_linear_class()
                setattr(parent, name, cls(child))
                replaced += 1
    return replaced
