"""Run a docs page's Python block as a reader would, and read what the page says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def section(page: str, start: str, end: str | None = None) -> str:
    """The text of ``page`` (under docs/) from ``start`` up to ``end`` (or the page's end)."""
    text = (DOCS / page).read_text()
    begin = text.index(start)
    return text[begin:text.index(end, begin) if end else None]


def run_first_block(text: str, name: str) -> str:
    """Execute the first ```python block of ``text`` in a fresh namespace; its stdout."""
    block = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, name, "exec"), {"__name__": "__doc__"})
    return out.getvalue()


def said_to_print(text: str) -> str:
    """The line the page says the block prints: "prints `...`"."""
    return re.search(r"prints `(.*?)`", text).group(1)
