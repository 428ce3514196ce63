"""Example budgets of the property tests: each test's own count in CI, ``FDP_SEARCH_SCALE``
times it in the random search (``bash .ci/search``; see tests/conftest.py)."""

from __future__ import annotations

import os


def examples(count: int) -> int:
    """``count`` scaled by the search budget (1 unless FDP_SEARCH_SCALE is set)."""
    scale = int(os.environ.get("FDP_SEARCH_SCALE", "1"))
    if scale < 1:
        raise ValueError(f"FDP_SEARCH_SCALE={scale} must be a positive integer")
    return count * scale
