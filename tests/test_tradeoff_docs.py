"""The worked example of docs/tradeoff.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tradeoff_doc_example_runs(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "tradeoff.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/tradeoff.md has no python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "docs/tradeoff.md", "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert "0.7404" in out and "4.377" in out  # values stated in the doc's comments
    assert (tmp_path / "tradeoff.png").stat().st_size > 1000
    import matplotlib.pyplot as plt

    plt.close("all")
