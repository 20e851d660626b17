"""The trainer's arguments: one typed definition for the command line and for Dagster.

:class:`TrainerArgs` is the single source of names, types, defaults and help. The trainer
parses its command line with :func:`parser` (built from the fields); the ``training_run``
asset's launchpad config takes its defaults from :data:`DEFAULTS` and renders a job's
command line with :meth:`TrainerArgs.to_argv`. No Dagster import here: this runs inside jobs.

>>> args = TrainerArgs(spec="mix.json", text_encoder="enc", steps=5)
>>> TrainerArgs.from_argv(args.to_argv()) == args
True
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainerArgs:
    """Everything one training run is told (the model and data come from the mixture spec)."""

    spec: str = _opt("", "mixture spec JSON (local path, s3:// or gs://)")
    steps: int = _opt(40, "optimizer steps")
    batch_size: int = _opt(8, "samples per batch per rank (one aspect bucket per batch)")
    resolution: int = _opt(32, "side of a square bucket in pixels (other buckets keep the area)")
    patch: int = _opt(4, "patch size of the transformer")
    dim: int = _opt(128, "transformer width")
    depth: int = _opt(4, "transformer blocks")
    heads: int = _opt(4, "attention heads")
    lr: float = _opt(1e-3, "AdamW learning rate")
    seed: int = _opt(0, "seed (model init, shuffling)")
    caption_seed: int = _opt(0, "seed of the per-sample caption choice")
    text_encoder: str | None = _opt(None, "text encoder: hub id or folder (on-the-fly mode)")
    text_tower: str | None = _opt(None, "tower name (default: from the encoder folder name)")
    max_text_length: int = _opt(32, "tokens per caption")
    text_layer: int = _opt(-1, "hidden-state layer used as the text latent")
    precomputed_latents: bool = _opt(False, "read text latents from the shards instead of encoding captions")
    checkpoint_dir: str | None = _opt(None, "folder for step_*.pt / last.pt (shared filesystem)")
    checkpoint_every: int = _opt(0, "checkpoint every N steps (0: only at the end)")
    workers: int = _opt(1, "DataLoader workers per rank")
    device: str = _opt("auto", "auto, cpu, cuda, cuda:N")
    precision: str = _opt("auto", "auto (bf16 autocast on CUDA, fp32 on CPU), bf16 (autocast, fp32 master weights) "
                                  "or fp32 (TF32 matmuls on CUDA)")
    compile: bool = _opt(False, "torch.compile the transformer")
    peak_tflops: float = _opt(0.0, "the device's peak dense TFLOP/s for MFU (0: known GPUs by name)")
    log_every: int = _opt(10, "log loss and samples/s every N steps")
    warmup_steps: int = _opt(3, "steps excluded from samples/s")
    cache_root: str | None = _opt(None, "local cache for remote (s3://, gs://) streams")
    record_samples: str | None = _opt(None, "write the (image_id, caption_key) of every step here (JSON)")
    metrics_json: str | None = _opt(None, "also write the final metrics here")

    def problems(self) -> list[str]:
        """What is wrong with these arguments (empty when they can run)."""
        out = []
        if not self.spec:
            out.append("--spec is required")
        if not self.precomputed_latents and not self.text_encoder:
            out.append("--text-encoder is required unless --precomputed-latents is given")
        if self.precomputed_latents and not self.text_tower:
            out.append("--precomputed-latents needs --text-tower (the tower name in the shards' latent columns)")
        if self.steps < 1 or self.batch_size < 1:
            out.append("--steps and --batch-size must be >= 1")
        if self.precision not in ("auto", "bf16", "fp32"):
            out.append(f"--precision {self.precision!r} is not one of auto, bf16, fp32")
        return out

    def to_argv(self) -> list[str]:
        """The command line that parses back to these arguments (defaults left out)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default and f.name != "spec":
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> TrainerArgs:
        """Parse a command line (exits with a usage message naming the problem, like any CLI)."""
        p = parser()
        ns = p.parse_args(argv)
        args = cls(**vars(ns))
        bad = args.problems()
        if bad:
            p.error("; ".join(bad))
        return args

    def replace(self, **changes: Any) -> TrainerArgs:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


#: The defaults, for the Dagster launchpad config.
DEFAULTS = TrainerArgs()


def parser() -> argparse.ArgumentParser:
    """The trainer's argument parser, built from :class:`TrainerArgs`."""
    p = argparse.ArgumentParser(prog="prx_assets.training.train",
                                description="Reference trainer: stream a mixture, encode captions, train.")
    for f in fields(TrainerArgs):
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata["help"]
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true", help=help_)
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(flag, type=kind, default=f.default, required=f.name == "spec",
                       help=help_ + ("" if f.default in (None, "") else f" (default: {f.default})"))
    return p
