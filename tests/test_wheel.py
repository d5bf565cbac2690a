"""A wheel install runs the app with no checkout: the configs ship inside the package (``lightning_hybrid.configs``).
Its console script is the one test of ``lightning-hybrid-train`` training in a process of its own (the other app
tests run its ``main`` in theirs; ``tests/test_app_resume.py`` SIGKILLs one).

The wheel is built from this tree and installed into a fresh virtual environment; its dependencies come from the
environment running the tests (a path entry, not an install), so no package index is needed.
"""

import json
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import APP_TINY

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(*cmd, cwd, timeout=600):
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return out


def test_the_wheel_installed_app_trains_outside_a_checkout(tmp_path):
    source, dist = tmp_path / "source", tmp_path / "dist"  # built from a copy: the build leaves nothing in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "logs"))
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, source, cwd=tmp_path)
    (wheel,) = dist.glob("lightning_hybrid-*.whl")
    shipped = zipfile.ZipFile(wheel).namelist()
    assert "lightning_hybrid/configs/train.yaml" in shipped
    assert "lightning_hybrid/configs/hybrid/default.yaml" in shipped
    assert "lightning_hybrid/engine/engine.py" in shipped

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)  # this pip installs into it
    python = venv / "bin" / "python"
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path
    )
    own = _run(python, "-c", "import site; print(site.getsitepackages()[0])", cwd=tmp_path).stdout.strip()
    Path(own, "test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    find = "import importlib.util; print(importlib.util.find_spec('lightning_hybrid').origin)"  # found, not imported
    where = _run(python, "-c", find, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    out = _run(venv / "bin" / "lightning-hybrid-train", f"paths.output_dir={run_dir}", *APP_TINY, cwd=run_dir)
    assert re.search(r"final val_loss: \d+\.\d{4}", out.stdout)  # the console script, as a user types it
    assert "litlogger" not in out.stdout + out.stderr and "LeafSpec" not in out.stdout + out.stderr  # no asides
    summary = json.loads((run_dir / "tensorboard" / "hybrid" / "hybrid_summary.json").read_text())
    assert summary["steps_total"] == 12 and summary["backward_skipped"] > 0
