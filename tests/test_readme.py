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
    assert "why larger: DP-SGD-JL clips by an estimate" in result.stdout  # JL's epsilon is explained
    assert png.stat().st_size > 1000


def test_readme_use_example_runs_and_its_comments_hold():
    """The README's python block runs; its stated ~epsilon, 0.1 % gap and calibration hold."""
    import fdp

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    ns: dict = {"__name__": "__readme__"}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), ns)
    lo, hi = ns["acc"].get_epsilon_bounds(delta=1e-5)
    stated = re.search(r"certified upper bound, ~([\d.]+)", blocks[0])
    assert stated, "the README no longer states the epsilon of its example"
    decimals = len(stated.group(1).split(".")[1])
    assert abs(float(stated.group(1)) - hi) <= 10.0**-decimals
    assert hi - lo <= 1e-3 * hi  # "within 0.1 % of each other"
    assert ns["acc"].get_delta(epsilon=2.0) > 1e-5  # 2.0 < eps(1e-5), so delta(2.0) > 1e-5
    sigma = ns["sigma"]
    mech = fdp.Gaussian(noise_multiplier=sigma, sampling_rate=256 / 60000)
    assert fdp.PLDAccountant().compose(mech, steps=14100).get_epsilon(1e-5) <= 1.0


def test_readme_command_lines_run(tmp_path):
    """Each complete `fdp ...` line of the README's command-line block runs (exit 0)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Command line\n\n```bash\n(.*?)```", readme, flags=re.S)
    assert block, "README has no command-line block"
    text = block.group(1).replace("\\\n", " ")
    lines = [line.split("#")[0].split() for line in text.splitlines() if line.startswith("fdp ")]
    complete = [words for words in lines if "..." not in words]
    assert len(complete) >= 3
    for words in complete:
        words = [str(tmp_path / w) if w.endswith(".png") else w for w in words]
        words = ["1,5" if w == "1,5,10,30" else ("2" if w == "15" else w) for w in words]  # keep it short
        proc = subprocess.run([sys.executable, "-m", "fdp", *words[1:]], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, (words, proc.stderr[-2000:])
        assert any(c in proc.stdout for c in "[|{")
