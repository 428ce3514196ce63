"""CI is deterministic: the property tests draw the same examples on every run."""

from __future__ import annotations

import os
import pathlib

from hypothesis import settings

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_ci_profile_is_derandomized_and_keeps_no_database():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None
    if os.environ.get("FDP_HYPOTHESIS_PROFILE", "ci") == "ci":
        assert settings.default.derandomize and settings.default.database is None


def test_ci_selects_the_ci_profile_and_the_search_is_its_own_command():
    assert "--hypothesis-profile=ci" in (ROOT / ".ci" / "run").read_text()
    search = (ROOT / ".ci" / "search").read_text()
    assert "FDP_HYPOTHESIS_PROFILE=search" in search
    assert "bash .ci/search" in (ROOT / "README.md").read_text()


def test_every_property_budget_scales_with_the_search():
    """A literal max_examples would not grow under ``bash .ci/search``."""
    literal = [f"{path.name}:{i}" for path in sorted((ROOT / "tests").rglob("test_*.py"))
               for i, line in enumerate(path.read_text().splitlines(), 1)
               if "max_examples=" in line and "max_examples=examples(" not in line]
    assert not literal, f"use max_examples=examples(n) (tests/hypothesis_budget.py) at {literal}"
