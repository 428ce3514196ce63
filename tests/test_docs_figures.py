"""The Concepts pages' figures: the script that draws them runs, and every page shows them."""

from __future__ import annotations

import importlib.util
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def _figures_module():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_is_drawn_as_a_png(tmp_path):
    figures = _figures_module()
    figures.main(tmp_path)
    for name in figures.FIGURES:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_each_figure_is_committed_and_shown_on_a_page():
    names = [*_figures_module().FIGURES, "privacy_curves.png"]
    pages = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for name in names:
        assert (ROOT / "docs" / "img" / name).exists(), name
        assert f"](img/{name})" in pages, f"no page shows img/{name}"
