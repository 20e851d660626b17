"""Fault cases end to end (part of ``python -m bench faults``): an operator's worst days on a small
project, and whether the next run recovers.

- **kill -9** of ``prx-assets run`` at every crash point (:data:`prx_assets.core.faults.CRASH_POINTS`),
  one after another on one data root (each run gets further, as the work before is done), then a
  plain run: a case is *recovered* when the run after it got past its point and the final lab,
  subsets, shard sets and mixture equal a clean run's, with no duplicate key;
- **flipped bytes** (256) in a shard file of a published set and in a Lance data file of
  ``images.lance``: recovered when ``doctor --verify`` finds it, publishing from the corrupt lab is
  refused, and ``doctor --verify --repair`` leaves a clean verify;
- **an erasure** of two images: recovered when no file under the data root holds their stored bytes.

Bytes lost: stored bytes of the clean run's images missing or different after every case (the
erased ones excepted). Corrupt samples published: samples of any readable shard set whose bytes do
not match the digest the lab recorded at ingest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[1]
CLI = str(Path(sys.executable).parent / "prx-assets")
SELECT = "*training_mixture"  # everything but the training job


def _project(base: Path, name: str, models: dict[str, str]) -> dict[str, Any]:
    """A data root with the demo corpus, its own Dagster instance and a copy of the shipped config."""
    from prx_assets.core.config.storage import DataRoot
    from prx_assets.core.demo.corpus import generate_demo_corpus

    where = base / name
    for sub in ("data", "home", "tmp"):
        (where / sub).mkdir(parents=True)
    shutil.copytree(REPO / "config", where / "config")
    generate_demo_corpus(DataRoot(str(where / "data")), n_photos=12, n_catalog=6, n_web=6)
    env = {**os.environ, "PRX_DATA_ROOT": str(where / "data"), "DAGSTER_HOME": str(where / "home"),
           "TMPDIR": str(where / "tmp"), "PRX_CONFIG_DIR": str(where / "config"), "PRX_LEASE_TTL_SECONDS": "20",
           "PRX_CAPTIONER_MODEL": models["vl"], "PRX_EMBEDDER_MODEL": models["siglip"],
           "PRX_TEXT_ENCODER_MODEL": models["text"]}
    env.pop("PRX_CRASH_AT", None)
    return {"dir": where, "data": where / "data", "env": env}


def _cli(p: dict[str, Any], *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**p["env"], **({"PRX_CRASH_AT": crash} if crash else {})}
    return subprocess.run([CLI, *args], cwd=p["dir"], env=env, text=True, capture_output=True, timeout=900,
                          check=False)


def lab_bytes(p: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """``image id -> (stored digest, stored bytes)`` of the lab's images."""
    import lance

    t = lance.dataset(str(p["data"] / "lance" / "images.lance")).to_table(columns=["image_id", "jpeg"]).to_pylist()
    return {r["image_id"]: (hashlib.sha256(r["jpeg"]).hexdigest(), len(r["jpeg"])) for r in t}


def corrupt_published(p: dict[str, Any]) -> tuple[int, int]:
    """``(samples read, samples whose bytes do not match the lab's digest)`` over every shard set the
    loader accepts (withdrawn and quarantined ones are refused or moved away)."""
    from prx_assets.core.manifests import read_shard_set_at
    from prx_assets.core.publish.shards import open_shard_set
    from prx_assets.errors import WithdrawnError

    digests = {k: v[0] for k, v in lab_bytes(p).items()}
    read = bad = 0
    for manifest_path in sorted((p["data"] / "mds").glob("*/*/manifest.json")):
        if manifest_path.parent.name.startswith("."):
            continue
        try:
            with open_shard_set(read_shard_set_at(str(manifest_path))) as sds:
                for s in sds:
                    read += 1
                    bad += digests.get(s["image_id"]) != hashlib.sha256(s["image"]).hexdigest()
        except WithdrawnError:
            continue
    return read, bad


def kill_cases(p: dict[str, Any]) -> list[dict[str, Any]]:
    """Kill a run at each crash point in turn; what each run did."""
    from prx_assets.core.faults import CRASH_POINTS

    out = []
    for point in CRASH_POINTS:
        r = _cli(p, "run", "--select", SELECT, crash=point)
        out.append({"case": f"kill -9 at {point}", "killed": r.returncode == -9, "rc": r.returncode})
    final = _cli(p, "run", "--select", SELECT)
    for i, case in enumerate(out):  # the next run got past this point: killed further on, or finished
        after = out[i + 1] if i + 1 < len(out) else {"killed": False, "rc": final.returncode}
        case["recovered"] = case["killed"] and (after["killed"] or after["rc"] == 0)
    out.append({"case": "final run", "rc": final.returncode, "recovered": final.returncode == 0})
    return out


def _flip(path: Path, offset: int, n: int = 256) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_cases(p: dict[str, Any]) -> list[dict[str, Any]]:
    """A flipped shard and a flipped Lance data file: found, refused, repaired."""
    import lance

    out = []
    set_dir = next(d for d in sorted((p["data"] / "mds" / "demo_all").iterdir()) if not d.name.startswith("."))
    shard = next(set_dir.rglob("*.mds"))
    _flip(shard, shard.stat().st_size // 2)
    found = _cli(p, "doctor", "--verify").returncode == 1
    repaired = _cli(p, "doctor", "--verify", "--repair").returncode == 0
    out.append({"case": "flipped shard", "found": found, "recovered": found and repaired
                and _cli(p, "doctor", "--verify").returncode == 0})

    uri = p["data"] / "lance" / "images.lance"
    row = lance.dataset(str(uri)).to_table(columns=["jpeg"], limit=1).to_pylist()[0]
    hit = next((f, f.read_bytes().find(row["jpeg"][:256])) for f in sorted((uri / "data").glob("*.lance"))
               if f.read_bytes().find(row["jpeg"][:256]) >= 0)
    _flip(hit[0], hit[1] + len(row["jpeg"]) // 2)
    found = _cli(p, "doctor", "--verify").returncode == 1
    recipes = p["dir"] / "config" / "recipes.yaml"
    recipes.write_text(recipes.read_text() + "  - name: late\n    captions: [short]\n")
    refused = _cli(p, "run", "--select", "curated_subsets mds_shards").returncode == 1
    repaired = _cli(p, "doctor", "--verify", "--repair").returncode == 0
    rerun = _cli(p, "run", "--select", SELECT).returncode == 0
    out.append({"case": "flipped Lance data file", "found": found, "publish_refused": refused,
                "recovered": found and refused and repaired and rerun
                and _cli(p, "doctor", "--verify").returncode == 0})
    return out


def erase_case(p: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Erase two images; whether any file under the data root still holds their stored bytes."""
    import lance

    rows = lance.dataset(str(p["data"] / "lance" / "images.lance")).to_table(
        columns=["image_id", "jpeg"], limit=2).to_pylist()
    ids_file = p["dir"] / "erase.txt"
    ids_file.write_text("".join(r["image_id"] + "\n" for r in rows))
    rc = _cli(p, "optout", "--ids", str(ids_file), "--erase").returncode
    holding = [str(f) for f in p["data"].rglob("*") if f.is_file()
               and any(r["jpeg"] in f.read_bytes() for r in rows)]
    rerun = _cli(p, "run", "--select", SELECT).returncode
    return ({"case": "erasure of 2 images", "files_still_holding": len(holding),
             "recovered": rc == 0 and not holding and rerun == 0}, {r["image_id"] for r in rows})


def run() -> dict[str, Any]:
    """Every case on a fresh project beside a clean reference run."""
    from prx_assets.core.demo.tiny_models import build_tiny_qwen3_text, build_tiny_qwen3_vl, build_tiny_siglip

    base = Path(tempfile.mkdtemp(prefix="prx-bench-cases-"))
    try:
        models = {"vl": str(build_tiny_qwen3_vl(base / "models" / "vl")),
                  "siglip": str(build_tiny_siglip(base / "models" / "siglip")),
                  "text": str(build_tiny_qwen3_text(base / "models" / "text"))}
        reference, hurt = _project(base, "reference", models), _project(base, "hurt", models)
        if _cli(reference, "run", "--select", SELECT).returncode != 0:
            raise RuntimeError("the clean reference run failed")
        ref = lab_bytes(reference)
        cases = kill_cases(hurt)
        same_as_clean = lab_bytes(hurt) == ref
        cases += flip_cases(hurt)
        erased_case, erased = erase_case(hurt)
        cases.append(erased_case)
        now = lab_bytes(hurt)
        lost = [k for k, v in ref.items() if k not in erased and now.get(k) != v]
        read, bad = corrupt_published(hurt)
        tried = [c for c in cases if c["case"] != "final run"]
        return {"cases_tried": len(tried), "cases_recovered": sum(bool(c["recovered"]) for c in tried),
                "same_as_clean_run_after_kills": same_as_clean, "images_lost": len(lost),
                "bytes_lost": sum(ref[k][1] for k in lost), "samples_read_back": read,
                "corrupt_samples_published": bad, "cases": cases}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    lines = [f"fault cases: {r['cases_recovered']} of {r['cases_tried']} recovered; bytes lost {r['bytes_lost']} "
             f"({r['images_lost']} images); corrupt samples published {r['corrupt_samples_published']} of "
             f"{r['samples_read_back']} read back; lab equal to a clean run's after the kills: "
             f"{r['same_as_clean_run_after_kills']}"]
    lines += [f"  {'recovered' if c['recovered'] else 'NOT recovered'}: {c['case']}" for c in r["cases"]]
    return "\n".join(lines)
