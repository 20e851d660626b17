"""One definition of the trainer's arguments, shared by its command line and the Dagster launchpad."""

import pytest

from prx_assets.defs.training import TrainingConfig
from prx_assets.training.args import DEFAULTS, TrainerArgs, parser


def test_command_line_round_trips() -> None:
    args = TrainerArgs(spec="s3://b/mix's.json", steps=7, lr=0.01, precomputed_latents=True, text_tower="t",
                       checkpoint_dir="/shared/ckpt dir")
    assert TrainerArgs.from_argv(args.to_argv()) == args
    assert "--max-text-length" not in args.to_argv()  # defaults are left to the trainer


def test_launchpad_defaults_are_the_trainer_defaults() -> None:
    config = TrainingConfig()
    for name in ("steps", "batch_size", "resolution", "dim", "depth", "heads", "lr", "seed", "workers",
                 "checkpoint_every", "precision", "compile", "peak_tflops"):
        assert getattr(config, name) == getattr(DEFAULTS, name), name
    help_text = parser().format_help()
    assert f"(default: {DEFAULTS.steps})" in help_text


@pytest.mark.parametrize(("argv", "message"), [
    (["--spec", "m.json"], "--text-encoder is required"),
    (["--spec", "m.json", "--precomputed-latents"], "needs --text-tower"),
    (["--spec", "m.json", "--text-encoder", "e", "--steps", "0"], "must be >= 1"),
    (["--spec", "m.json", "--text-encoder", "e", "--precision", "fp8"], "'fp8' is not one of auto, bf16, fp32"),
])
def test_bad_arguments_name_the_problem(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        TrainerArgs.from_argv(argv)
    assert message in capsys.readouterr().err


def test_training_flops_match_a_flop_counter() -> None:
    """The MFU numerator: the formula's forward + backward matmul FLOPs against torch's own count."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from prx_assets.training.model import FlowTransformer, ModelConfig, flow_matching_loss, training_flops

    cfg = ModelConfig(text_dim=48, dim=64, depth=3, heads=4, patch=4)
    model = FlowTransformer(cfg)
    x, text = torch.randn(2, 3, 32, 48), torch.randn(2, 10, 48)
    mask = torch.ones(2, 10, dtype=torch.bool)
    with FlopCounterMode(display=False) as counter:
        flow_matching_loss(model, x, text, mask).backward()
    tokens = (32 // 4) * (48 // 4)
    # torch's counter does not see inside the fused attention kernel, so compare the rest; inputs need
    # no gradient, so torch also skips two small input-gradient matmuls the formula counts.
    linear = 2 * training_flops(cfg, tokens, 10, attention_scores=False)
    assert 0.97 < counter.get_total_flops() / linear <= 1.0
    scores = training_flops(cfg, tokens, 10) - training_flops(cfg, tokens, 10, attention_scores=False)
    assert scores == 3 * 2 * cfg.depth * (2 * tokens * tokens * cfg.dim + 2 * tokens * 11 * cfg.dim)


def test_bf16_autocast_keeps_fp32_master_weights() -> None:
    import torch

    from prx_assets.training.model import FlowTransformer, ModelConfig, flow_matching_loss, peak_tflops

    model = FlowTransformer(ModelConfig(text_dim=16, dim=32, depth=1, heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = flow_matching_loss(model, torch.randn(2, 3, 16, 16), torch.randn(2, 4, 16),
                                  torch.ones(2, 4, dtype=torch.bool))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.blocks[0].mlp[0].weight.grad.dtype == torch.float32
    assert peak_tflops("NVIDIA H200") == 989.4 and peak_tflops("cpu") is None
