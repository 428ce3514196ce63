"""Hypothesis profiles: CI is deterministic, the random search is its own command.

* ``ci`` (the default, and what ``.ci/run`` selects): derandomized, no example database,
  so an unchanged tree draws the same examples on every run and machine.
* ``search`` (``bash .ci/search``): fresh random draws, the local example database, and
  ``FDP_SEARCH_SCALE`` times each test's example budget (``hypothesis_budget.examples``).
  Every counterexample it finds becomes an ``@example`` of its test.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis_budget import examples

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("search", derandomize=False, deadline=None, print_blob=True,
                          max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("FDP_HYPOTHESIS_PROFILE", "ci"))
