"""A wheel install (not editable) runs the demo from another folder: templates and config ship inside."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).parents[1]


def test_built_wheel_runs_the_demo_from_another_folder(tmp_path: Path, tiny_models: dict[str, str]) -> None:
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRX_", "DAGSTER_HOME", "PYTHONPATH"))}
    # Build from the tracked files only (what a clean clone has), outside the checkout.
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    wheels = tmp_path / "wheels"
    build = subprocess.run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                            str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("prx_assets-*.whl")

    # A fresh venv that reuses the project venv's dependencies but not its editable prx_assets.
    venv = tmp_path / "venv"
    subprocess.run([py, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    (Path(site) / "project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    inst = subprocess.run([py, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert inst.returncode == 0, inst.stderr[-3000:]
    where = subprocess.run([str(vpy), "-c", "import prx_assets; print(prx_assets.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout.strip()
    assert where.startswith(site), f"prx_assets imported from {where}, not from the wheel in {site}"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env.update({"PRX_CAPTIONER_MODEL": tiny_models["vl"], "PRX_EMBEDDER_MODEL": tiny_models["siglip"],
                "PRX_TEXT_ENCODER_MODEL": tiny_models["text"], "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}"})
    demo = subprocess.run([str(venv / "bin" / "prx-assets"), "demo", "--small"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=900)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out[-4000:]
    assert "wrote the demo config to" in out and (elsewhere / "config" / "sources.yaml").is_file()
    assert "FAILED" not in demo.stdout and "training_run[demo_mix] ran" in demo.stdout, out[-4000:]
    assert "tiny random captioner" in demo.stdout and "warns on every partition by design" in demo.stdout
    assert (elsewhere / "data" / "lance" / "images.lance").is_dir() and (elsewhere / ".dagster_home").is_dir()
