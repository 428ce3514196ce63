"""Lower bounds on epsilon for heavy-tailed mechanisms: optimistic grids cut at a cap."""

from __future__ import annotations

import math
from typing import Any

from fdp.mechanisms.base import Mechanism
from fdp.pld.cells import Direction, Grid
from fdp.pld.compose import compose
from fdp.pld.discretise import discretise_optimistic
from fdp.pld.pmf import DiscretePLD

__all__ = ["capped_lower_epsilon", "capped_optimistic_plds"]

#: Cells of a single-step optimistic grid cut at a cap.
CAP_POINTS = 1 << 20
#: Successive caps grow by this factor.
CAP_GROWTH = 1000.0


def capped_lower_epsilon(events: list[tuple[Mechanism, int]], direction: Direction, delta: float,
                         tail_mass: float, lower: float, upper: float, max_points: int,
                         cache: dict[Any, Any]) -> float:
    """A lower bound on epsilon from optimistic grids cut at growing caps.

    A heavy upper tail (fdp.JL with r = 1: P(L > l) ~ l^(-1/2)) stretches the
    automatic grid to losses ~1e15, so h is huge and rounding every step down by
    up to h (T h in all) swamps the lower bound. For a LOWER bound the range may
    be cut anywhere: the mass above a cap c is put at c (``p_right`` on the top
    point), which only lowers losses, so delta(eps) of the composition only
    decreases (monotone in each loss, by coupling). On [l_0, c] with
    2^20 cells the spacing is h = (c - l_0) / 2^20 and the rounding costs at most
    T h; the FFT window may be cut too, since mass above it wraps to smaller
    losses (:mod:`fdp.pld.compose`). Caps start at 10 * max(lower, 10) and grow
    1000x until the bound found is below c / 10 (the cap no longer limits it),
    the cap passes 4 * upper, or the grid would not be cut any more. Every value
    found is a valid lower bound; the largest is returned.
    """
    steps = sum(c for _, c in events)
    top = max(m.loss_range(direction, max(tail_mass / steps, 1e-300))[1] for m, _ in events)
    best = lower
    cap = 10.0 * max(lower, 10.0)
    while cap < top:
        if math.isfinite(upper):
            cap = min(cap, 4.0 * upper)
        key = ("capped", direction, tail_mass, cap)
        if key not in cache:
            plds = capped_optimistic_plds([m for m, _ in events], direction, tail_mass / steps, cap)
            cache[key] = compose([(pld, c) for pld, (_, c) in zip(plds, events)],
                                 pessimistic=False, tail_mass=tail_mass, max_points=max_points)
        found = cache[key].epsilon(delta)
        best = max(best, found)
        if found < 0.1 * cap or (math.isfinite(upper) and cap >= 4.0 * upper):
            break
        cap *= CAP_GROWTH
    return best


def capped_optimistic_plds(mechanisms: list[Mechanism], direction: Direction, step_tail: float,
                           cap: float, points: int = CAP_POINTS) -> list[DiscretePLD]:
    """Optimistic single-step PLDs on one grid of ``points`` cells cut at the loss ``cap``.

    The mass above ``cap`` sits on the top grid point: losses only decrease, so
    every composition of these PLDs has delta(eps) <= the truth (a lower bound).
    """
    ranges = [m.loss_range(direction, max(step_tail, 1e-300)) for m in mechanisms]
    bottom = min(lo for lo, _ in ranges)
    h = (cap - bottom) / points
    return [discretise_optimistic(m.loss_cells(direction, Grid.covering(lo, min(hi, cap), h), pessimistic=False))
            for m, (lo, hi) in zip(mechanisms, ranges)]
