"""Hypothesis profiles: CI is deterministic, the random search is its own command.

* ``ci`` (the default, and what ``.ci/run`` selects): derandomized, no example database,
  so an unchanged tree draws the same examples on every run and machine.
* ``search`` (``bash .ci/search``): fresh random draws, the local example database, and
  ``FDP_SEARCH_SCALE`` times each test's example budget (``hypothesis_budget.examples``).
  Every counterexample it finds becomes an ``@example`` of its test.

Tests marked ``slow`` are skipped unless asked for (``bash .ci/slow``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis_budget import examples

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("search", derandomize=False, deadline=None, print_blob=True,
                          max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FDP_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (each a minute or more, with a cheaper test of its code path in
    the default run) run only with FDP_RUN_SLOW=1 or an ``-m`` selecting them: ``bash .ci/slow``.
    The default run is what CI runs, in under 20 minutes on 2 cores."""
    if os.environ.get("FDP_RUN_SLOW") == "1" or "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: bash .ci/slow (or FDP_RUN_SLOW=1) runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
