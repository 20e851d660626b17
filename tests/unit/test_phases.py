"""Phased mixtures: config, spec identity, the step schedule, and the loader reading one phase."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from prx_assets.core.demo.shard_sets import write_shard_set
from prx_assets.core.manifests import MixtureSpec, ShardSetManifest
from prx_assets.core.publish.mixture import load_mixtures, resolve
from prx_assets.errors import ConfigError
from prx_assets.training.phases import Position, Window, phase_batches, schedule, window_at

PHASED = """\
mixtures:
  - name: progressive
    phases:
      - {name: low_res, steps: 30, resolution: 16, streams: [{recipe: a, proportion: 0.5}, {recipe: b, proportion: 0.5}]}
      - {name: anneal, steps: 10, resolution: 32, streams: [{recipe: b, choose: 100}]}
"""


def _sets(tmp_path: Path) -> dict[str, ShardSetManifest]:
    return {"a": write_shard_set(tmp_path / "a", (300,), recipe="a"),
            "b": write_shard_set(tmp_path / "b", (200,), recipe="b", first_uid=300)}


def test_phases_parse_resolve_and_version(tmp_path: Path) -> None:
    cfg = tmp_path / "mixtures.yaml"
    cfg.write_text(PHASED)
    mix = load_mixtures(cfg, known_recipes=["a", "b"])["progressive"]
    assert [p.name for p in mix.phases] == ["low_res", "anneal"] and [s.recipe for s in mix.streams] == ["a", "b"]
    sets = _sets(tmp_path)
    spec = resolve(mix, sets.__getitem__)
    assert [s.recipe for s in spec.streams] == ["a", "b"]  # every set any phase reads: lineage
    low, anneal = spec.phases
    assert (low.steps, low.resolution, low.epoch_size) == (30, 16, 500)
    assert anneal.expected_samples_per_stream == {"b": 100} and anneal.epoch_size == 100
    again = MixtureSpec.from_json(spec.to_json())
    assert again == spec and again.phase("anneal") == anneal
    for change in ({"steps": 11}, {"resolution": 64}):
        other = dataclasses.replace(spec, phases=(low, dataclasses.replace(anneal, **change)))
        assert other.versioned().mixture_version != spec.mixture_version, change
    moved = dataclasses.replace(spec, phases=(low, dataclasses.replace(
        anneal, streams=tuple(dataclasses.replace(s, uri="s3://elsewhere") for s in anneal.streams))))
    assert moved.versioned().mixture_version == spec.mixture_version  # where the sets live is not identity
    with pytest.raises(ValueError, match=r"has phases \['low_res', 'anneal'\]; pass phase=<name>"):
        spec.phase(None)


def test_a_mixture_without_phases_keeps_its_version(tmp_path: Path) -> None:
    cfg = tmp_path / "mixtures.yaml"
    cfg.write_text("mixtures:\n  - {name: base, streams: [{recipe: a, proportion: 0.7}, {recipe: b, proportion: 0.3}]}\n")
    spec = resolve(load_mixtures(cfg)["base"], _sets(tmp_path).__getitem__)
    doc = {"name": spec.name, "epoch_size": spec.epoch_size,  # the version as it was computed before phases
           "expected_samples_per_stream": spec.expected_samples_per_stream,
           "streams": [s.identity() for s in spec.streams]}
    assert spec.mixture_version == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
    assert spec.phases == () and spec.phase(None) is None


@pytest.mark.parametrize("text,message", [
    ("mixtures:\n  - {name: m, streams: [{recipe: a}], phases: [{name: p, steps: 1, streams: [{recipe: a}]}]}\n",
     "sets both streams and phases"),
    ("mixtures:\n  - {name: m, phases: [{name: p, streams: [{recipe: a}]}]}\n", r"missing 'phases\[0\].steps' \(fix: add steps: "),
    ("mixtures:\n  - {name: m, phases: [{name: p, steps: 1, streams: [{recipe: a}]}, "
     "{name: p, steps: 1, streams: [{recipe: a}]}]}\n", "phase name 'p' is invalid or duplicated"),
    ("mixtures:\n  - {name: m, phases: [{name: p, steps: 1, resolution: 0, streams: [{recipe: a}]}]}\n",
     r"phases\[0\].resolution=0 must be >= 1"),
])
def test_bad_phases_are_refused_with_the_fix(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "mixtures.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_mixtures(cfg)


def test_phase_batches_switch_at_the_window_and_resume_in_the_phase() -> None:
    windows = [Window("low", 0, 3, 16), Window("high", 3, 5, 32)]
    opened: list[tuple[str | None, Any]] = []

    def open_phase(w: Window, at: Position | None) -> list[str]:
        opened.append((w.name, at))
        return [f"{w.name}-{i}" for i in range(100)]

    def batches_of(ds: list[str]) -> Any:
        return iter([[x] for x in ds])

    steps = [(w.name, b[0]) for w, _, b in phase_batches(windows, 0, open_phase, batches_of)]
    assert steps == [("low", "low-0"), ("low", "low-1"), ("low", "low-2"), ("high", "high-0"), ("high", "high-1")]
    opened.clear()
    at = Position(phase="high", samples=1, state={"sample_in_epoch": 2})
    resumed = [(w.name, b[0]) for w, _, b in phase_batches(windows, 4, open_phase, batches_of, at)]
    assert resumed == [("high", "high-0")] and opened == [("high", at)]
    assert window_at(windows, 3) == windows[1] and window_at(windows, 5) is None
    assert [w.stop for w in schedule(MixtureSpec(name="m", epoch_size=1, streams=(),
                                                 expected_samples_per_stream={}), 7, 32)] == [7]


def test_the_loader_reads_the_phase_it_is_given(tmp_path: Path) -> None:
    from streaming.base.util import clean_stale_shared_memory

    from prx_assets.loader import PrxStreamingDataset

    clean_stale_shared_memory()
    cfg = tmp_path / "mixtures.yaml"
    cfg.write_text(PHASED)
    spec = resolve(load_mixtures(cfg)["progressive"], _sets(tmp_path).__getitem__)
    with pytest.raises(ValueError, match="pass phase=<name>"):
        PrxStreamingDataset(spec=spec, batch_size=4)
    with PrxStreamingDataset(spec=spec, phase="anneal", batch_size=4, shuffle=True) as ds:
        uids = [s["uid"] for s in ds]
    assert len(uids) == 100 and all(u >= 300 for u in uids)  # choose 100 of set b only


def test_lineage_shows_the_phases() -> None:
    from prx_assets.core.lineage import render

    mixture = {"name": "progressive", "mixture_version": "abc", "epoch_size": 500, "streams": [],
               "phases": [{"name": "low_res", "steps": 30, "resolution": 16, "epoch_size": 500,
                           "streams": [{"recipe": "a", "shard_set_id": "s-a", "weighting": "proportion 0.5",
                                        "expected_per_epoch": 250}]}]}
    text = render(mixture)
    assert "phase low_res: 30 steps at resolution 16, epoch 500: a proportion 0.5 (s-a)" in text


def test_the_mixture_asset_shows_each_phase(tmp_path: Path) -> None:
    from prx_assets.defs.mixture import streams_table

    cfg = tmp_path / "mixtures.yaml"
    cfg.write_text(PHASED)
    spec = resolve(load_mixtures(cfg)["progressive"], _sets(tmp_path).__getitem__)
    rows = streams_table(spec).splitlines()[2:]
    assert [r.split(" | ")[:4] for r in rows] == [["| low_res", "30", "16", "a"], ["| low_res", "30", "16", "b"],
                                                   ["| anneal", "10", "32", "b"]]
    assert rows[-1].endswith("| 100 |")  # choose 100 of b in the anneal
