"""Reference trainer: ``python -m prx_assets.training.train --spec MIXTURE.json ...``.

Runs inside a SLURM job (or locally). It streams the mixture with ``StreamingDataset``,
decodes JPEGs into aspect-bucketed batches, encodes captions on the fly with a Hugging Face
text encoder (or reads precomputed latents from the shards with ``--precomputed-latents``),
and trains a small flow-matching transformer for ``--steps`` steps, with DDP when launched
on several ranks (``torchrun``) and checkpoints in ``--checkpoint-dir`` (resumed from
``last.pt`` when present). Rank 0 reports logs, loss and samples/s and the final
materialization (data version = hash of the final checkpoint) through Dagster Pipes when
the job was started by Dagster; without Pipes it prints the same to stdout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prx_assets.core.manifests import MixtureSpec
from prx_assets.training.args import TrainerArgs
from prx_assets.training.phases import Position, Window, phase_batches, schedule

LOSS_WINDOW = 5


class _Stdout:
    """Pipes stand-in when the trainer runs without Dagster."""

    class log:
        @staticmethod
        def info(msg: str) -> None:
            print(msg, flush=True)

        warning = info

    def report_asset_materialization(self, metadata: dict[str, Any], data_version: str | None = None) -> None:
        print(json.dumps({"materialization": metadata, "data_version": data_version}, default=str), flush=True)


def parse_args(argv: list[str] | None = None) -> TrainerArgs:
    """Command-line options (see ``--help``; defined once, in :mod:`prx_assets.training.args`)."""
    return TrainerArgs.from_argv(argv)


def loss_picture(losses: list[float]) -> str:
    """The loss per step as an inline chart (Markdown), for the materialization's metadata."""
    from prx_assets.core.visuals import line_chart, md_image

    title = f"flow-matching loss per step ({len(losses)} steps)"
    try:
        return md_image(line_chart(losses or [0.0], title, y_label="loss", x_label="steps"), title)
    except Exception as e:  # a picture must never fail a finished run
        return f"could not draw the loss curve: {type(e).__name__}: {e}"


def read_spec(uri: str) -> MixtureSpec:
    """The mixture spec from a local path, ``s3://`` or ``gs://``."""
    if uri.startswith(("s3://", "gs://")):
        from prx_assets.core.config.storage import DataRoot

        root, _, name = uri.rpartition("/")
        return MixtureSpec.from_json(DataRoot(root).read_bytes(name), uri)
    return MixtureSpec.from_json(Path(uri).read_bytes(), uri)


def _pipes(rank: int) -> Any:
    if rank == 0 and os.environ.get("DAGSTER_PIPES_CONTEXT"):
        from dagster_pipes import open_dagster_pipes

        return open_dagster_pipes()
    return contextlib.nullcontext(_Stdout() if rank == 0 else None)


def _loader(dataset: Any, workers: int, pin_memory: bool = False) -> Iterator[dict[str, Any]]:
    """The dataset's samples through a DataLoader in batches of its ``batch_size`` (the order
    streaming's ``state_dict`` counts in), epoch after epoch until the caller stops."""
    from torch.utils.data import DataLoader

    from prx_assets.training.data import collate_one

    kw: dict[str, Any] = {"batch_size": dataset.batch_size, "num_workers": workers, "collate_fn": collate_one,
                          "pin_memory": pin_memory}
    if workers:
        kw.update(multiprocessing_context="spawn", persistent_workers=True)
    loader = DataLoader(dataset, **kw)
    while True:  # epochs until the step budget is spent
        got = False
        for batch in loader:
            got = True
            yield from batch
        if not got:
            raise RuntimeError("the mixture yielded no samples; check the spec's shard sets")


@dataclass
class Env:
    """Where this rank runs: world, rank, device and precision."""

    world: int
    rank: int
    local_rank: int
    device: Any
    bf16: bool
    peak: float | None  # the device's dense bf16 peak TFLOP/s, for MFU (None: unknown)

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")


@dataclass
class Tally:
    """What the run measured, step by step."""

    losses: list[float] = field(default_factory=list)
    record: list[list[str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    phase_starts: dict[str, list[int]] = field(default_factory=dict)
    phase_pixels: dict[str, list[int]] = field(default_factory=dict)  # height, width of each phase's first batch
    text_s: float = 0.0
    timed_flops: float = 0.0
    timed_samples: int = 0
    timed_s: float = 0.0

    def samples_per_second(self, world: int) -> float:
        return self.timed_samples * world / self.timed_s if self.timed_s else 0.0


def _env(args: TrainerArgs) -> Env:
    """This rank's environment (torchrun's variables), its process group, TF32 on CUDA."""
    import torch
    import torch.distributed as dist

    from prx_assets.training.model import peak_tflops

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "auto":
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda = device.type == "cuda"
    if cuda:  # TF32 for the matmuls autocast leaves in fp32 (and all of them with --precision fp32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return Env(world=world, rank=int(os.environ.get("RANK", "0")), local_rank=local_rank, device=device,
               bf16=args.precision == "bf16" or (args.precision == "auto" and cuda),
               peak=args.peak_tflops or (peak_tflops(torch.cuda.get_device_name(device)) if cuda else None))


def train(args: TrainerArgs) -> dict[str, Any]:
    """Run training; return the final metrics (rank 0) or {} (other ranks)."""
    import torch
    import torch.distributed as dist

    from prx_assets.core.models.text_encoder import TextEncoder, TextTowerSpec

    env = _env(args)
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=env.device).manual_seed(args.seed + env.rank)
    with contextlib.ExitStack() as stack:
        pipes = stack.enter_context(_pipes(env.rank))
        spec = read_spec(args.spec)
        encoder = None if args.precomputed_latents else TextEncoder(
            TextTowerSpec(model=args.text_encoder, name=args.text_tower, max_length=args.max_text_length,
                          layer=args.text_layer), device=str(env.device))
        tower = encoder.spec.tower() if encoder is not None else args.text_tower
        cache_root = args.cache_root
        if cache_root is None and any(s.uri.startswith(("s3://", "gs://")) for s in spec.streams):
            cache_root = tempfile.mkdtemp(prefix="prx-train-cache-")  # per run: shard sets never share a cache
            stack.callback(shutil.rmtree, cache_root, True)
        ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
        resume = ckpt_dir / "last.pt" if ckpt_dir and (ckpt_dir / "last.pt").is_file() else None
        saved = torch.load(resume, map_location=env.device) if resume is not None else None
        step = int(saved["step"]) if saved is not None else 0
        windows = schedule(spec, args.steps, args.resolution)
        tally = Tally()
        if pipes:
            phases = ", phases " + ", ".join(f"{w.name} steps {w.first}-{w.stop}" for w in windows) if spec.phases else ""
            pipes.log.info(f"training on mixture {spec.name} v{spec.mixture_version} ({len(spec.streams)} streams"
                           f"{phases}), text latents {_mode(args)} ({tower}), world size {env.world}, device {env.device}")
        source = PhaseSource(args=args, env=env, spec=spec, tower=tower, cache_root=cache_root, tally=tally,
                             pipes=pipes, start=step)
        at = Position(**saved["position"]) if saved is not None and saved.get("position") else None
        model: Any = None
        opt: Any = None
        position: dict[str, Any] | None = None
        t_last = time.perf_counter()
        for window, dataset, batch in phase_batches(windows, step, source.open, source.batches, at):
            t0 = time.perf_counter()
            pixels, text, mask, text_dt = _inputs(batch, encoder, env)
            tally.phase_pixels.setdefault(window.name or "all", [int(pixels.shape[2]), int(pixels.shape[3])])
            if model is None:
                model, opt = _build(args, env, int(text.shape[-1]), saved)
                if saved is not None and pipes:
                    pipes.log.info(f"resumed from {resume} at step {step}")
            loss = _optimize(model, opt, pixels, text, mask, gen, env)
            step += 1
            _account(tally, args, model_cfg(model), step, loss, batch, pixels, text, text_dt, t_last)
            t_last = time.perf_counter()
            if pipes and (step % args.log_every == 0 or step == args.steps):
                pipes.log.info(f"step {step}/{args.steps} loss {tally.losses[-1]:.4f} samples/s "
                               f"{tally.samples_per_second(env.world):.1f} (step {(t_last - t0) * 1000:.0f} ms, "
                               f"text {text_dt * 1000:.0f} ms)")
            if ckpt_dir and (step == windows[-1].stop or (args.checkpoint_every and step % args.checkpoint_every == 0)):
                position = _position(window, dataset, source.taken[0], env.world, env.device)  # every rank agrees
                if env.rank == 0 and step != windows[-1].stop:
                    _save(ckpt_dir, model, opt, step, model_cfg(model), keep=f"step_{step:07d}.pt", position=position)
        if env.world > 1:
            dist.barrier()
        if model is None and saved is not None:  # resumed at or past the last step: nothing left to train
            model = _model_from(saved, env.device)
        metrics: dict[str, Any] = {}
        if env.rank == 0:
            ckpt = _save(ckpt_dir, model, opt, step, model_cfg(model), keep="final.pt",
                         position=position if step == windows[-1].stop else None) if ckpt_dir else None
            metrics = _metrics(args, env, spec, windows, tally, step, model, ckpt, tower)
            _report(pipes, args, metrics, tally, spec)
        if env.world > 1:
            dist.destroy_process_group()
        return metrics


@dataclass
class PhaseSource:
    """Opens each phase's dataset and reads its aspect-bucketed batches, counting what the loader yields."""

    args: TrainerArgs
    env: Env
    spec: MixtureSpec
    tower: str | None
    cache_root: str | None
    tally: Tally
    pipes: Any
    start: int  # the step the run starts (or resumes) at
    taken: list[int] = field(default_factory=lambda: [0])  # samples the loader yielded in the current phase

    def open(self, window: Window, at: Position | None) -> Any:
        """The phase's dataset (positioned at ``at`` when resuming inside it); every rank checks the step."""
        from prx_assets.training.data import build_dataset

        args, first = self.args, max(self.start, window.first)
        self.taken[0] = 0
        self.tally.phase_starts[window.name or "all"] = _agreed_step(first, self.env.world, self.env.device)
        ds = build_dataset(self.spec, batch_size=args.batch_size, resolution=window.resolution, multiple=args.patch,
                           seed=args.seed, caption_seed=args.caption_seed,
                           tower=self.tower if args.precomputed_latents else None, cache_root=self.cache_root,
                           # room for every step of the phase plus partly filled buckets, on every rank
                           min_epoch_size=2 * self.env.world * args.batch_size * (window.stop - window.first + 32),
                           phase=window.name)
        if at is not None and at.state is not None:
            ds.load_state_dict(at.state)
        if self.pipes:
            where = f" at sample {at.state['sample_in_epoch']}" if at is not None and at.state else ""
            self.pipes.log.info(f"phase {window.name or '(whole run)'}: steps {first}-{window.stop}, resolution "
                                f"{window.resolution}, streamed as one epoch of {len(ds)} per rank{where}")
        return ds

    def batches(self, ds: Any) -> Iterator[list[dict[str, Any]]]:
        """The dataset's samples in aspect-bucketed batches (undecodable ones counted in the tally)."""
        from prx_assets.training.data import bucketed_batches

        return bucketed_batches(_counted(_loader(ds, self.args.workers, pin_memory=self.env.cuda), self.taken),
                                self.args.batch_size, self.tally.skipped)


def _mode(args: TrainerArgs) -> str:
    return "precomputed" if args.precomputed_latents else "on_the_fly"


def _inputs(batch: list[dict[str, Any]], encoder: Any, env: Env) -> tuple[Any, Any, Any, float]:
    """A batch's pixels and text latents on the device (encoded now, or read from the shards), and the
    seconds encoding took."""
    import numpy as np
    import torch

    pixels = torch.from_numpy(np.stack([s["pixels"] for s in batch])).to(env.device, non_blocking=True)
    if encoder is None:
        text = torch.from_numpy(np.stack([s["latent"] for s in batch])).to(env.device)
        mask = torch.from_numpy(np.stack([s["mask"] for s in batch])).to(env.device)
        return pixels, text, mask, 0.0
    te = time.perf_counter()
    text, mask = encoder.encode([s["caption"] for s in batch])
    text = text.half().float()  # the precision precomputed latents are stored in
    if env.cuda:
        torch.cuda.synchronize(env.device)
    return pixels, text, mask, time.perf_counter() - te


def _build(args: TrainerArgs, env: Env, text_dim: int, saved: dict[str, Any] | None) -> tuple[Any, Any]:
    """The model (DDP-wrapped on several ranks, compiled if asked) and its optimizer, from the checkpoint
    when resuming."""
    import torch

    from prx_assets.training.model import FlowTransformer, ModelConfig

    cfg = ModelConfig(text_dim=text_dim, patch=args.patch, dim=args.dim, depth=args.depth, heads=args.heads)
    torch.manual_seed(args.seed)
    net = FlowTransformer(cfg).to(env.device)  # fp32 master weights; bf16 only inside autocast
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[env.local_rank] if env.cuda else None) \
        if env.world > 1 else net
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=env.cuda)
    if saved is not None:
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    return model, opt


def _optimize(model: Any, opt: Any, pixels: Any, text: Any, mask: Any, gen: Any, env: Env) -> Any:
    """One optimizer step on the flow-matching loss; the loss."""
    import torch

    from prx_assets.training.model import flow_matching_loss

    with torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=env.bf16):
        loss = flow_matching_loss(model, pixels, text, mask, generator=gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if env.cuda:
        torch.cuda.synchronize(env.device)
    return loss


def _account(tally: Tally, args: TrainerArgs, cfg: Any, step: int, loss: Any, batch: list[dict[str, Any]],
             pixels: Any, text: Any, text_dt: float, t_last: float) -> None:
    """Record a step's loss and samples, and (after the warm-up) its time and model FLOPs."""
    from prx_assets.training.model import training_flops

    tally.losses.append(float(loss.detach()))
    if args.record_samples:
        tally.record.extend([s["image_id"], s["caption_key"]] for s in batch)
    if step > args.warmup_steps:
        tokens = (pixels.shape[2] // args.patch) * (pixels.shape[3] // args.patch)
        tally.timed_flops += len(batch) * training_flops(cfg, tokens, int(text.shape[1]))
        tally.timed_samples += len(batch)
        tally.timed_s += time.perf_counter() - t_last
        tally.text_s += text_dt


def _metrics(args: TrainerArgs, env: Env, spec: MixtureSpec, windows: list[Window], tally: Tally, step: int,
             model: Any, ckpt: Path | None, tower: str | None) -> dict[str, Any]:
    """The run's final metrics (rank 0)."""
    digest = hashlib.sha256(Path(ckpt).read_bytes()).hexdigest()[:16] if ckpt else ""
    timed_s = tally.timed_s
    metrics = {
        "mode": _mode(args), "text_tower": tower, "text_encoder": args.text_encoder or "",
        "steps": step, "world_size": env.world, "device": str(env.device), "batch_size_per_rank": args.batch_size,
        "loss_first": _mean(tally.losses[:LOSS_WINDOW]), "loss_last": _mean(tally.losses[-LOSS_WINDOW:]),
        "loss_curve": [round(x, 5) for x in tally.losses],
        "samples_per_second": round(tally.samples_per_second(env.world), 3),
        "text_encode_seconds": round(tally.text_s, 4), "timed_seconds": round(timed_s, 4),
        "text_encode_fraction": round(tally.text_s / timed_s, 4) if timed_s else 0.0,
        "params": sum(p.numel() for p in model.parameters()) if model is not None else 0,
        "precision": "bf16 autocast" if env.bf16 else ("tf32" if env.cuda else "fp32"), "compiled": args.compile,
        # model FLOPs (forward + backward matmuls of the transformer) per second, all ranks
        "model_tflops_per_second": _sig(tally.timed_flops * env.world / timed_s / 1e12) if timed_s else 0.0,
        "mixture": spec.name, "mixture_version": spec.mixture_version,
        "checkpoint": str(ckpt) if ckpt else "", "checkpoint_sha256_16": digest,
        "samples_skipped": len(tally.skipped),
        "phases": [{"name": w.name, "first_step": w.first, "stop_step": w.stop, "resolution": w.resolution}
                   for w in windows] if spec.phases else [],
        "phase_starts_by_rank": tally.phase_starts, "phase_first_batch_hw": tally.phase_pixels,
        "skipped_examples": "; ".join(f"{i}: {why[:200]}" for i, why in tally.skipped[:5]),
    }
    if env.peak and timed_s:  # model FLOPs utilisation per device, against its dense bf16 peak
        metrics.update(mfu=_sig(tally.timed_flops / timed_s / 1e12 / env.peak), peak_tflops_per_device=env.peak)
    return metrics


def _report(pipes: Any, args: TrainerArgs, metrics: dict[str, Any], tally: Tally, spec: MixtureSpec) -> None:
    """Write the records asked for and report the materialization (rank 0)."""
    if tally.skipped:
        pipes.log.warning(f"{len(tally.skipped)} samples could not be decoded and were skipped, e.g. "
                          f"{tally.skipped[0][0]}: {tally.skipped[0][1][:300]}")
    if args.record_samples:
        Path(args.record_samples).write_text(json.dumps(tally.record))
    if args.metrics_json:
        Path(args.metrics_json).write_text(json.dumps(metrics, indent=1))
    pipes.log.info(f"done: {metrics['steps']} steps, loss {metrics['loss_first']:.4f} -> {metrics['loss_last']:.4f}, "
                   f"{metrics['samples_per_second']} samples/s, text encoding "
                   f"{metrics['text_encode_fraction']:.1%} of step time")
    digest = metrics["checkpoint_sha256_16"]
    pipes.report_asset_materialization(
        metadata={k: {"raw_value": v, "type": "json"} if isinstance(v, dict | list) else v
                  for k, v in metrics.items() if k != "loss_curve"} |
        {"loss_curve": {"raw_value": loss_picture(tally.losses), "type": "md"}},
        data_version=f"{spec.mixture_version}-{digest}" if digest else spec.mixture_version)


def model_cfg(model: Any) -> Any:
    """The ModelConfig of a (possibly DDP-wrapped) model."""
    return getattr(model, "module", model).cfg


def _save(ckpt_dir: Path, model: Any, opt: Any, step: int, cfg: Any, keep: str,
          position: dict[str, Any] | None = None) -> Path:
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = {"model": getattr(model, "module", model).state_dict(), "optimizer": opt.state_dict() if opt else {},
             "step": step, "config": cfg.to_dict(), "position": position}
    tmp = ckpt_dir / f".{keep}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, ckpt_dir / keep)
    last_tmp = ckpt_dir / ".last.pt.tmp"
    torch.save(state, last_tmp)
    os.replace(last_tmp, ckpt_dir / "last.pt")
    return ckpt_dir / keep


def _model_from(saved: dict[str, Any], device: Any) -> Any:
    """The model of a checkpoint (a run resumed with no step left to take)."""
    from prx_assets.training.model import FlowTransformer, ModelConfig

    net = FlowTransformer(ModelConfig(**saved["config"])).to(device)
    net.load_state_dict(saved["model"])
    return net


def _counted(samples: Iterator[dict[str, Any]], taken: list[int]) -> Iterator[dict[str, Any]]:
    """``samples``, counting each in ``taken[0]`` (what this rank's loader has yielded in the phase)."""
    for sample in samples:
        taken[0] += 1
        yield sample


def _agreed_step(step: int, world: int, device: Any) -> list[int]:
    """The step each rank is at (gathered from every rank: the trainer shows they agree)."""
    if world == 1:
        return [step]
    import torch
    import torch.distributed as dist

    mine = torch.tensor([step], dtype=torch.int64, device=device)  # on the device: NCCL moves device tensors
    got = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(got, mine)
    steps = [int(t.item()) for t in got]
    if len(set(steps)) != 1:
        raise RuntimeError(f"ranks disagree on the step where a phase starts: {steps}")
    return steps


def _position(window: Window, dataset: Any, taken: int, world: int, device: Any) -> dict[str, Any]:
    """Where the phase's stream stands: the samples every rank's loader has yielded (the fewest of any
    rank), as the dataset's ``state_dict``; a resumed run loads it and reads on from there. Samples a
    rank held in a partly filled aspect bucket at that moment are not trained in this epoch."""
    fewest = taken
    if world > 1:
        import torch
        import torch.distributed as dist

        t = torch.tensor([taken], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        fewest = int(t.item())
    return {"phase": window.name, "samples": fewest,
            "state": dataset.state_dict(num_samples=fewest * world, from_beginning=False)}


def _sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (a CPU run's TFLOP/s are tiny; rounding to places loses them).

    >>> _sig(0.000123456), _sig(412.3456)
    (0.0001235, 412.3)
    """
    return float(f"{x:.{digits}g}")


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 5) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
