"""Skip lists applied where the epoch is arranged: ranks as processes on loopback (gloo), DataLoader
workers, the four batching methods, skip lists of 0%, 1% spread and 20% clustered; exact resumption;
a trainer's own ``StreamingDataset`` subclass through the README's lines."""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.loader_ranks import run_ranks
from prx_assets.core.demo.shard_sets import skip_pattern, write_mixture, write_shard_set

BATCH = 16
METHODS = ("random", "stratified", "per_stream", "device_per_stream")
#: skip case -> (skip share and pattern on set a, weighting of set a and set b)
SKIPS: dict[str, tuple[float, str, dict[str, Any], dict[str, Any]]] = {
    "none": (0.0, "none", {"proportion": 0.7}, {"proportion": 0.3}),
    "spread1": (0.01, "spread", {"repeat": 1}, {"repeat": 2}),
    "clustered20": (0.2, "clustered", {"choose": 1400}, {"choose": 600}),
}
A_STREAMS = (1280, 320)  # set a: a base stream and a delta
B_STREAMS = (480,)  # set b: uids after set a's


def _physical(uid: int, a_streams: tuple[int, ...] = A_STREAMS) -> int:
    """Which physical stream a uid belongs to (a.s0, a.s1, b.s0)."""
    return 0 if uid < a_streams[0] else 1 if uid < sum(a_streams) else 2


@pytest.fixture(scope="module")
def mixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per skip case: its mixture spec path, the skipped uids, and each live uid's expected draws."""
    root = tmp_path_factory.mktemp("loader-ranks")
    out = {}
    for name, (share, pattern, wa, wb) in SKIPS.items():
        skip = [skip_pattern(n, share, pattern, seed=i) for i, n in enumerate(A_STREAMS)]
        a = write_shard_set(root / name / "a", A_STREAMS, skip, recipe="a")
        b = write_shard_set(root / name / "b", B_STREAMS, recipe="b", first_uid=sum(A_STREAMS))
        write_mixture(root / name / "spec.json", name, [(a, wa), (b, wb)])
        live = tuple(n - len(hidden) for n, hidden in zip(A_STREAMS, skip, strict=True))
        compacted = write_shard_set(root / name / "a-compacted", live, recipe="a")  # the oracle: skipped rewritten away
        write_mixture(root / name / "oracle.json", name, [(compacted, wa), (b, wb)])
        skipped = {int(i) + (A_STREAMS[0] if s else 0) for s, hidden in enumerate(skip) for i in hidden}
        live_a = [u for u in range(sum(A_STREAMS)) if u not in skipped]
        live_b = list(range(sum(A_STREAMS), sum(A_STREAMS) + sum(B_STREAMS)))
        per = _draws(wa, len(live_a), len(live_a) + len(live_b)), _draws(wb, len(live_b), len(live_a) + len(live_b))
        out[name] = {"spec": str(root / name / "spec.json"), "oracle": str(root / name / "oracle.json"),
                     "compacted": live, "skipped": skipped,
                     "expected": {u: per[0] for u in live_a} | {u: per[1] for u in live_b}}
    return out


def _draws(weighting: dict[str, Any], live: int, total: int) -> float:
    """Expected draws of each live sample of a stream in one epoch (proportions over an epoch of ``total``)."""
    if "repeat" in weighting:
        return float(weighting["repeat"])
    if "choose" in weighting:
        return weighting["choose"] / live
    return total * weighting["proportion"] / live


def _cases(mixtures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every skip case x batching method; and where streaming may drop part batches, the same
    mixture with the skipped samples rewritten away (what the skip list must read as)."""
    cases = []
    for skip, m in mixtures.items():
        for method in METHODS:
            cases.append({"name": f"{skip}-{method}", "spec": m["spec"], "batch_size": BATCH, "batching": method})
            if skip != "none" and method != "random":
                cases.append({**cases[-1], "name": f"{skip}-{method}-oracle", "spec": m["oracle"]})
    return cases


def _per_stream(ranks: list[dict[str, Any]], case: str, a_streams: tuple[int, ...]) -> Counter[int]:
    return Counter(_physical(u, a_streams) for r in ranks for b in r[case]["batches"] for batch in [b] for u in batch)


def _check_epoch(ranks: list[dict[str, Any]], case: str, mix: dict[str, Any], world: int, workers: int) -> None:
    method = case.split("-", 1)[1]
    batches = [r[case]["batches"] for r in ranks]
    assert len({len(b) for b in batches}) == 1, f"{case}: batches per rank {[len(b) for b in batches]}"
    assert len({sum(map(len, b)) for b in batches}) == 1, f"{case}: samples per rank differ"
    seen = Counter(u for b in batches for batch in b for u in batch)
    assert not set(seen) & mix["skipped"], f"{case}: skipped samples yielded"
    assert set(seen) <= set(mix["expected"]), f"{case}: unknown samples yielded"
    slack = world * max(1, workers) * BATCH  # streaming pads a rank's share / drops a part batch per stream
    excess = sum(max(0, n - math.ceil(mix["expected"][u])) for u, n in seen.items())
    shortfall = sum(max(0, math.floor(e) - seen.get(u, 0)) for u, e in mix["expected"].items())
    assert excess <= slack, f"{case}: {excess} draws above the weighting"
    if method == "random":
        assert shortfall == 0, f"{case}: {shortfall} live samples drawn fewer times than their weighting"
    elif f"{case}-oracle" in ranks[0]:  # what each stream yields: as if the skipped samples were never written
        assert _per_stream(ranks, case, A_STREAMS) == _per_stream(ranks, f"{case}-oracle", mix["compacted"])
    else:
        assert shortfall <= slack * 3, f"{case}: {shortfall} live samples drawn fewer times than their weighting"
    if method in ("per_stream", "device_per_stream"):
        mixed = [batch for b in batches for batch in b if len({_physical(u) for u in batch}) > 1]
        assert not mixed, f"{case}: device batches mixing streams, e.g. {mixed[:2]}"


@pytest.mark.parametrize("world,workers", [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)])
def test_every_rank_reads_the_same_epoch(mixtures: dict[str, dict[str, Any]], tmp_path: Path,
                                         world: int, workers: int) -> None:
    ranks = run_ranks(world, workers, _cases(mixtures), tmp_path)
    for case in (c for c in ranks[0] if not c.endswith("-oracle")):
        _check_epoch(ranks, case, mixtures[case.split("-", 1)[0]], world, workers)


@pytest.mark.parametrize("method", ["random", "device_per_stream"])
def test_resumption_yields_exactly_the_rest(mixtures: dict[str, dict[str, Any]], tmp_path: Path, method: str) -> None:
    """2 ranks x 2 workers: stopped after a third and after two thirds of the epoch, a new set of
    processes that loads the state yields the rest: with what came before, exactly the full epoch."""
    spec = mixtures["clustered20"]["spec"]
    base = {"spec": spec, "batch_size": BATCH, "batching": method}
    full = run_ranks(2, 2, [{**base, "name": "full"}], tmp_path / "full")
    per_rank = len(full[0]["full"]["batches"])
    epoch = Counter(u for r in full for b in r["full"]["batches"] for u in b)
    for k in (per_rank // 3, 2 * per_rank // 3):
        k -= k % 2  # device_per_stream resumes at global batches
        first = run_ranks(2, 2, [{**base, "name": "first", "stop_after": k}], tmp_path / f"first{k}")
        state = first[0]["first"]["state"]
        assert state["sample_in_epoch"] == k * BATCH * 2
        rest = run_ranks(2, 2, [{**base, "name": "rest", "resume": state}], tmp_path / f"rest{k}")
        before = Counter(u for r in first for b in r["first"]["batches"] for u in b)
        after = Counter(u for r in rest for b in r["rest"]["batches"] for u in b)
        assert before + after == epoch, f"resumed after {k} batches: the epoch differs"
        assert not set(after) & mixtures["clustered20"]["skipped"]
        assert len({len(r["rest"]["batches"]) for r in rest}) == 1


def _readme_block() -> str:
    text = (Path(__file__).parents[1] / "README.md").read_text()
    found = re.search(r"<!-- subclass-example -->\n *```python\n(.*?)\n *```", text, re.S)
    assert found, "README lost its subclass example (<!-- subclass-example --> before a python block)"
    return textwrap.dedent(found.group(1))


def test_a_trainers_dataset_subclass_gets_skip_lists_through_the_readme_lines(
        mixtures: dict[str, dict[str, Any]]) -> None:
    from streaming import StreamingDataset

    class Processed(StreamingDataset):
        """What a trainer's dataset does: its own constructor argument and ``__getitem__``."""

        def __init__(self, *, resolution: int = 256, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.resolution = resolution

        def __getitem__(self, idx: int) -> dict[str, Any]:
            sample = super().__getitem__(idx)
            return {"uid": sample["uid"], "resolution": self.resolution}

    space: dict[str, Any] = {"StreamingProcessedDataset": Processed, "spec_uri": mixtures["clustered20"]["spec"]}
    exec(compile(_readme_block(), "README.md", "exec"), space)  # the README's own lines
    data = space["data"]
    try:
        got = list(data)
        assert got and all(s["resolution"] == 256 for s in got)
        uids = Counter(s["uid"] for s in got)
        assert not set(uids) & mixtures["clustered20"]["skipped"]
        assert len(got) == data.epoch_size == 2000  # choose 1400 + 600, over live samples
        assert data.live_samples == len(mixtures["clustered20"]["expected"])
    finally:
        data.close()
