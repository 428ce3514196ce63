"""benchmarks/privacy_curves.py runs and prints sound, ordered bounds (2 epochs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "privacy_curves.py"


def test_two_epochs_of_the_seed_figure():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "2"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "privacy_curves: 100%" in proc.stderr and "10/10" in proc.stderr  # the tqdm bar, finished
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
    cells = [[tuple(float(v) for v in c.strip().split("-", 1)) for c in row.split("|")[2:-1]] for row in rows]
    for epoch in cells:
        assert all(0.0 < lo <= hi for lo, hi in epoch)
        # eps falls with r (r = 1, 5, 10, 30) and the Gaussian is the smallest
        uppers = [hi for _, hi in epoch]
        lowers = [lo for lo, _ in epoch]
        assert all(lowers[i] > uppers[i + 1] for i in range(3))
        assert lowers[3] >= epoch[4][0]
    for (lo1, hi1), (lo2, hi2) in zip(*cells):  # monotone in epochs
        assert lo1 <= lo2 and hi1 <= hi2
