"""docs/cli.md, docs/risk.md and docs/interop.md run as written."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)


def _run_page(page: str) -> tuple[dict, str]:
    ns: dict = {"__name__": "__doc__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in _python_blocks(page):
            exec(compile(block, page, "exec"), ns)
    return ns, out.getvalue()


def test_risk_page_runs_and_its_numbers_hold():
    ns, out = _run_page("risk.md")
    risk = ns["risk"]
    about = re.search(r"# about \[([\d.]+), ([\d.]+)\]", _python_blocks("risk.md")[0])
    assert about and f"{risk.advantage[0]:.4f}" == about.group(1) and f"{risk.advantage[1]:.4f}" == about.group(2)
    assert "FPR 0.01: the best attack's TPR is in [0.04" in out  # "at FPR = 1 % ... about 4 %"
    assert 8.0 < risk.tpr_upper[0] / risk.fpr[0] < 9.5  # "right ~9x as often as wrong" at 0.01 %


def test_interop_page_runs_and_the_bracket_holds():
    pytest.importorskip("dp_accounting")
    ns, out = _run_page("interop.md")
    theirs = ns["theirs"].get_epsilon(1e-6)
    assert ns["lo"] <= theirs * (1 + 1e-9) and "fdp: [" in out
    assert theirs <= ns["hi"] * 1.01  # theirs is a pessimistic estimate of the same epsilon


def test_cli_page_commands_run():
    text = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"## Commands\n\n```bash\n(.*?)```", text, flags=re.S).group(1)
    for line in block.strip().splitlines():
        words = line.split()
        assert words[0] == "fdp"
        proc = subprocess.run([sys.executable, "-m", "fdp", *words[1:], "--json"], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, (line, proc.stderr[-2000:])
        data = json.loads(proc.stdout)
        assert data["command"] == words[1]
    shown = re.search(r"    (\{\"command\": \"epsilon\".*?\})\n", text, flags=re.S).group(1)
    keys = re.findall(r"\"(\w+)\":", shown)
    proc = subprocess.run([sys.executable, "-m", "fdp", "epsilon", "--noise-multiplier", "1.1", "--batch-size", "256",
                           "--dataset-size", "60000", "--epochs", "60", "--delta", "1e-5", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert list(json.loads(proc.stdout)) == keys
    err = re.search(r"\$ (fdp epsilon --noise-multiplier -1 .*)\n    (.*)\n", text)
    proc = subprocess.run([sys.executable, "-m", "fdp", *err.group(1).split()[1:]], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == err.group(2)


def test_nothing_points_outside_the_repository() -> None:
    """Users have the package and its docs, not the developers' design notes: no module,
    docs page, example, benchmark or test cites DESIGN.md, STYLE.md or ../shared."""
    roots = [ROOT / name for name in ("fdp", "fdp_tf", "docs", "examples", "benchmarks", "tests")]
    files = [p for root in roots for p in root.rglob("*") if p.suffix in (".py", ".md")]
    files.append(ROOT / "README.md")
    pattern = re.compile(r"DESIGN\.md|STYLE\.md|\.\./shared")
    here = Path(__file__).resolve()
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files if p.resolve() != here
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
