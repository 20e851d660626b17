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
                 "checkpoint_every"):
        assert getattr(config, name) == getattr(DEFAULTS, name), name
    help_text = parser().format_help()
    assert f"(default: {DEFAULTS.steps})" in help_text


@pytest.mark.parametrize(("argv", "message"), [
    (["--spec", "m.json"], "--text-encoder is required"),
    (["--spec", "m.json", "--precomputed-latents"], "needs --text-tower"),
    (["--spec", "m.json", "--text-encoder", "e", "--steps", "0"], "must be >= 1"),
])
def test_bad_arguments_name_the_problem(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        TrainerArgs.from_argv(argv)
    assert message in capsys.readouterr().err
