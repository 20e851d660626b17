"""The README's picture of the code matches the tree."""

import re
from pathlib import Path

REPO = Path(__file__).parents[2]


def _layout_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## How the code is organised", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_every_module_the_layout_names_exists() -> None:
    block = _layout_block()
    pkg = REPO / "prx_assets"
    current: Path | None = None
    named = 0
    top = pkg
    for line in block.splitlines():
        m = re.match(r"^(\w+)/", line)
        if m:
            top = REPO / m.group(1)
            assert top.is_dir(), f"README names {m.group(1)}/ but it does not exist"
            current = None
        m = re.match(r"^ {4}(\w+)/", line)
        if m:
            current = pkg / "core" / m.group(1)
            assert current.is_dir(), f"README names core/{m.group(1)}/ but it does not exist"
        m = re.match(r"^ {2}(\w+)/", line)
        if m and m.group(1) != "core":
            assert (pkg / m.group(1)).is_dir(), f"README names prx_assets/{m.group(1)}/"
            current = None
        for mod in re.findall(r"\b(\w+)\.py\b", line):
            candidates = [top / f"{mod}.py", pkg / f"{mod}.py", pkg / "core" / f"{mod}.py"]
            if current is not None:
                candidates.append(current / f"{mod}.py")
            candidates += list(pkg.glob(f"*/{mod}.py")) + list(pkg.glob(f"*/*/{mod}.py"))
            assert any(c.is_file() for c in candidates), f"README names {mod}.py, which is not in prx_assets/"
            named += 1
    assert named > 30


def test_every_core_package_is_in_the_layout() -> None:
    block = _layout_block()
    for sub in sorted(p for p in (REPO / "prx_assets" / "core").iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert f"{sub.name}/" in block, f"core/{sub.name}/ is missing from the README layout"
        for mod in sub.glob("*.py"):
            if mod.name != "__init__.py":
                assert mod.name in block, f"core/{sub.name}/{mod.name} is missing from the README layout"


def test_packaged_demo_config_is_the_repository_config() -> None:
    """The wheel ships config/ as package data; the two copies must not drift."""
    from prx_assets.core.config.project import default_config_files

    shipped = default_config_files()
    repo = {p.name: p.read_bytes() for p in (REPO / "config").glob("*.yaml")}
    assert shipped == repo, "copy config/*.yaml to prx_assets/defaults/config/ (the wheel ships that copy)"
    assert (REPO / "prx_assets" / "defaults" / "dagster.yaml").read_bytes() == (REPO / "dagster.yaml").read_bytes()
