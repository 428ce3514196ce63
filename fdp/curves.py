"""Epsilon over training: certified (lower, upper) bounds at many step counts at once.

``epsilon_curve(mechanism, steps, delta)`` answers "what is epsilon after each
epoch?" without one accountant per point. Each direction's single-step PLD is
discretised ONCE, on the grid :class:`fdp.PLDAccountant` would choose for the
largest T (level 0, the connect-the-dots upper bound; one halving for the merging
lower bound), and composed by FFT for every T (:func:`fdp.pld.compose.compose`).
Any grid gives valid bounds at any T; this one is only tightest at the largest.

* Directions: the one with the larger upper bound at T_max leads; the other is
  computed at T only if its upper bound at T_max (>= its epsilon at every T <= T_max)
  exceeds the leader's lower bound at T.
* Monotone in T: the T-fold composition is a post-processing of the (T+1)-fold one,
  so a lower bound at T is one at every later T and an upper bound at T one at every
  earlier T; each point takes the best of its neighbours.
* Heavy upper tails (fdp.JL with r = 1: losses up to ~1e15): the upper bounds use
  the accountant's grid for the next power-of-2 multiple of the first T, not T_max's
  (the loss range, hence h, grows with T), and the lower bounds optimistic grids cut
  at the power of 10 above 4x each T's upper bound (:mod:`fdp.pld.capped`: the mass
  above a cap put on it only lowers losses), ``CAP_POINTS`` cells composed in windows
  of ``CAP_WINDOW`` points (mass above a window wraps to smaller losses: lower delta).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fdp._validation import check_delta, check_integer
from fdp.accountant import MAX_FFT_POINTS, PLDAccountant
from fdp.mechanisms.base import Mechanism
from fdp.pld.capped import capped_optimistic_plds
from fdp.pld.cells import Direction
from fdp.pld.compose import compose
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic
from fdp.pld.queries import gap_unwarned, tail_budget

__all__ = ["CAP_POINTS", "CAP_WINDOW", "HEAVY_POINTS", "epsilon_curve"]

#: FFT window of the upper bounds for heavy tails (mass above it goes to +inf).
HEAVY_POINTS = 1 << 21
#: Heavy tails' lower bounds: cells of a capped single-step grid, and the FFT window.
CAP_POINTS, CAP_WINDOW = 1 << 19, 1 << 20
#: A loss range above this (at T_max's tail) is treated as a heavy tail.
HEAVY_LOSS = 1e6


def epsilon_curve(mechanism: Mechanism, steps: Sequence[int], delta: float, *,
                  progress: Any = None) -> list[tuple[float, float]]:
    """Certified (lower, upper) epsilon at ``delta`` after each number of steps.

    Args:
      mechanism: one step (e.g. ``fdp.JL(noise_multiplier=0.6, jl_projections=10,
        sampling_rate=256 / 25000)``).
      steps: increasing step counts T_1 < T_2 < ... (e.g. ``[98 * e for e in range(1, 16)]``).
      delta: delta in (0, 1).
      progress: an optional callable, called with no argument after each point
        (e.g. a tqdm bar's ``update``).

    Returns:
      [(lower, upper)] per entry of ``steps``: lower <= epsilon(T) <= upper.

    Raises:
      ValueError: steps empty, not increasing or below 1; delta outside (0, 1).
    """
    if not isinstance(mechanism, Mechanism):
        raise ValueError(f"mechanism must be an fdp mechanism (e.g. fdp.Gaussian); got {mechanism!r}")
    delta = check_delta(delta)
    counts = [check_integer("steps", t, low=1, high=10**12) for t in steps]
    if not counts or any(b <= a for a, b in zip(counts, counts[1:])):
        raise ValueError(f"steps must be a non-empty increasing list of integers >= 1; got {list(steps)}")
    tick = progress if progress is not None else (lambda: None)
    if mechanism.parts() != ((mechanism, 1),):  # composed of other mechanisms (k-of-t allocation)
        return _each_by_accountant(mechanism, counts, delta, tick)
    t_max = counts[-1]
    tail = tail_budget(delta)
    acc = PLDAccountant().compose(mechanism, steps=t_max)
    heavy = mechanism.loss_range(Direction.REMOVE, tail / t_max)[1] > HEAVY_LOSS
    max_points = HEAVY_POINTS if heavy else MAX_FFT_POINTS

    def side(d: Direction, pessimistic: bool, plan: PLDAccountant = acc):
        grid = plan._plan(d, tail, 0 if pessimistic else 1).grids[0]
        discretise = discretise_pessimistic if pessimistic else discretise_optimistic
        return discretise(mechanism.loss_cells(d, grid, pessimistic=pessimistic))

    horizons: dict[int, Any] = {}

    def heavy_upper(d: Direction, t: int):
        t_plan = counts[0]
        while t_plan < t:
            t_plan *= 2
        t_plan = min(t_plan, t_max)
        if t_plan not in horizons:
            horizons[t_plan] = side(d, True, PLDAccountant().compose(mechanism, steps=t_plan))
        return horizons[t_plan]

    def eps(pld, t: int, pessimistic: bool) -> float:
        return compose([(pld, t)], pessimistic=pessimistic, tail_mass=tail, max_points=max_points).epsilon(delta)

    uppers = {d: side(d, True) for d in (Direction.REMOVE, Direction.ADD)}
    last = {d: eps(pld, t_max, True) for d, pld in uppers.items()}
    lead = max(last, key=last.get)
    other = Direction.ADD if lead is Direction.REMOVE else Direction.REMOVE
    lowers: dict[Direction, Any] = {}
    capped = _CappedLower(mechanism, lead, tail / t_max, tail, delta) if heavy else None
    rows = []
    for t in counts:
        if t == t_max:
            hi = last[lead]
        else:
            hi = eps(heavy_upper(lead, t) if heavy else uppers[lead], t, True)
        if capped is not None:
            lo = capped(t, hi)
        else:
            lowers.setdefault(lead, side(lead, False))
            lo = eps(lowers[lead], t, False)
        if last[other] > lo:
            hi = max(hi, last[other] if t == t_max else eps(uppers[other], t, True))
            if capped is None:
                lowers.setdefault(other, side(other, False))
                lo = max(lo, eps(lowers[other], t, False))
        rows.append((lo, hi))
        tick()
    return _monotone_in_steps(rows)


def _each_by_accountant(mechanism: Mechanism, counts: list[int], delta: float,
                        tick: Any) -> list[tuple[float, float]]:
    """One accountant query per point, for a mechanism the accountant composes as parts."""
    rows = []
    for t in counts:
        with gap_unwarned():
            rows.append(PLDAccountant().compose(mechanism, steps=t).get_epsilon_bounds(delta))
        tick()
    return _monotone_in_steps(rows)


class _CappedLower:
    """Lower bounds from optimistic grids cut at a cap, for the leading direction.

    Caps grow 100-fold from the power of 10 above 4x the point's upper bound until the
    bound found is below cap / 10 or the cap passes 4x the upper bound; any cap gives a
    valid lower bound, and each cap's grid, discretised once, serves every point whose
    upper bound lies in its decade."""

    def __init__(self, mech: Mechanism, direction: Direction, step_tail: float, tail: float, delta: float) -> None:
        self.mech, self.direction, self.step_tail, self.tail, self.delta = mech, direction, step_tail, tail, delta
        self.plds: dict[float, Any] = {}

    def __call__(self, steps: int, upper: float) -> float:
        best = 0.0
        cap = 10.0 ** math.ceil(math.log10(4.0 * upper)) if math.isfinite(upper) else 100.0
        while True:
            if cap not in self.plds:
                self.plds[cap] = capped_optimistic_plds([self.mech], self.direction, self.step_tail, cap,
                                                        points=CAP_POINTS)[0]
            found = compose([(self.plds[cap], steps)], pessimistic=False, tail_mass=self.tail,
                            max_points=CAP_WINDOW).epsilon(self.delta)
            best = max(best, found)
            if found < 0.1 * cap or cap >= 4.0 * upper or not math.isfinite(found) or cap > 1e290:
                return best
            cap *= 100.0


def _monotone_in_steps(rows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each point's bounds tightened by its neighbours' (epsilon(T) is non-decreasing)."""
    lows = np.maximum.accumulate([lo for lo, _ in rows])
    highs = np.minimum.accumulate([hi for _, hi in rows][::-1])[::-1]
    return [(float(lo), float(hi)) for lo, hi in zip(lows, highs)]
