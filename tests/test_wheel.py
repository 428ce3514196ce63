"""`python -m build` makes a wheel that installs and runs (smoke test of the packaging)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_builds_installs_and_answers(tmp_path):
    pytest.importorskip("build")
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "License classifiers are deprecated" not in proc.stderr and "project.license" not in proc.stderr
    wheel, = out.glob("fdp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fdp/cli/__init__.py" in names and "fdp/py.typed" in names and "fdp_tf/__init__.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fdp = fdp.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the checkout's editable install
    proc = subprocess.run([sys.executable, "-m", "fdp", "epsilon", "--noise-multiplier", "1.1", "--batch-size", "256",
                           "--dataset-size", "60000", "--epochs", "60", "--delta", "1e-5", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 2.38 < json.loads(proc.stdout)["upper"] < 2.39
    where = subprocess.run([sys.executable, "-c", "import fdp; print(fdp.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env).stdout
    assert where.startswith(str(site))
