"""The README's quick start runs as written (its script, with its arguments)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quick_start_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"python (examples/quickstart\.py[^\n`]*)", readme)
    assert command, "README has no quick-start command"
    args = command.group(1).split()
    png = tmp_path / "quickstart.png"
    args = [a if a != "quickstart.png" else str(png) for a in args]
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "eps upper" in result.stdout
    assert png.stat().st_size > 1000
