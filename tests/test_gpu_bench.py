"""bench/gpu.py --smoke: the GPU bench's code paths (checkpoint build, captioner vs bare loop, trainer on
the fly vs precomputed) run on the CPU and produce every figure the GPU run reports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_bench_smoke_runs_every_code_path(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["mode"] == "smoke" and r["env"]["device"] == "cpu"
    assert json.loads(done.stdout.strip().splitlines()[-1]) == r  # the JSON is also the last line printed
    tiny = r["captions"]["tiny"]
    assert tiny["producer_thread"] is True and tiny["attention"] == "sdpa"
    for row in tiny["by_batch_size"].values():
        assert row["ours"]["images_per_s"] > 0 and row["bare"]["images_per_s"] > 0 and row["ratio"] > 0
        assert len(row["ours"]["seconds"]) == len(row["bare"]["seconds"]) == len(row["ours_sequential"]["seconds"]) == 2
        assert row["first_pass"]["seconds"] > 0 and row["ratio_sequential"] > 0  # whole untimed pass first
    point = r["trainer"]["points"]["tiny_64px"]
    assert point["same_samples_both_modes"] and len(point["samples_per_s"]["on_the_fly"]) == 2
    assert isinstance(point["on_the_fly_overhead_pct"], float)
    assert set(r["goals"]) == {"captions_8b_images_per_s", "trainer_mfu", "on_the_fly_overhead_pct_2b_512px"}
    assert all(g["value"] is None and g["met"] is None for g in r["goals"].values())  # not measured on a CPU
