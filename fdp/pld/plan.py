"""The grids of a composition: one spacing h for all steps, one range per mechanism.

h is a fraction ``grid_scale`` of the composed loss's standard deviation over
sqrt(T) (the per-step sd), estimated from a coarse pessimistic discretisation,
with floors that keep the composed window (~ +-20 sd) within ``max_points`` and
a single step's range within ``MAX_STEP_POINTS``; the main mechanism's atom is
put on the grid, where its discretisation is exact. Refinement level k halves h
k times.

Purely atomic losses whose atoms all lie on one lattice a Z (randomized response
without subsampling: +-eps0) are discretised exactly on the grid of spacing a, at
every level, when a is at least the spacing above: the composition is then exact
up to the FFT's round-off, however small the loss's sd (randomized response with
eps0 = 22.2 has sd ~ 7e-4 per step, and a grid of that scale would need ~10^7
points to hold 8 steps).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_pessimistic

__all__ = ["CAP_MARGIN", "COARSE_POINTS", "GridPlan", "LATTICE_DIVISORS", "MAX_COMPOSED_LOSS", "MAX_GRID_INDEX",
           "MAX_STEP_POINTS", "MIN_SPACING", "check_composable", "composed_sd", "exact_divisor", "grid_plan", "lattice_spacing", "query_cap"]

#: Grid points of the coarse discretisation used to size the fine grid.
COARSE_POINTS = 2000
#: Largest single-step grid.
MAX_STEP_POINTS = 1 << 22
#: A query whose answer is at most eps_hi needs no step's grid above eps_hi + CAP_MARGIN.
CAP_MARGIN = 40.0
#: Lattice spacings tried: (largest |atom|) / j for j = 1..LATTICE_DIVISORS.
LATTICE_DIVISORS = 64
#: Smallest grid spacing h: the automatic grid's floor, and the least grid_spacing.
MIN_SPACING = 1e-9
#: Largest |privacy loss| a composition may reach (steps times each step's largest
#: loss): the sums, Chernoff windows and margins of the planner need headroom below
#: the float64 maximum 1.8e308 (10^9 steps of Laplace(scale=1e-300) overflowed it).
MAX_COMPOSED_LOSS = 1e306
#: Largest |grid index| loss / h of a fixed grid_spacing: integers beyond 2^52 are no
#: longer exact float64 grid losses, and int64 offsets overflow soon after.
MAX_GRID_INDEX = 1 << 52


def query_cap(focus: tuple[float, float] | None) -> float | None:
    """The top of every step's grid for a query whose answer is in ``focus`` = (a, b).

    Cutting a step's grid at any cap is sound on both sides: the pessimistic cells
    send the mass above it to +inf, the optimistic ones round it down to the top
    point (losses only move up, resp. down). It costs little: moving one step's loss
    l > cap to +inf raises the composition's delta at eps <= b by

        E_P[1{l > cap} min(1, e^{eps - l - S})] <= P(l > cap) e^{b - cap} E_P[e^{-S}]
                                                 <= P(l > cap) e^{-CAP_MARGIN},

    S the other steps' loss (independent of l; E_P[e^{-L}] <= 1 for every privacy
    loss), and rounding it down to the cap lowers delta by at most as much: over T
    steps <= T P(l > cap) 4.3e-18. Where a heavy tail (fdp.JL with r <= 3) stretched
    the range far beyond the answer, the grid gets finer (7x at r = 2, T = 100,
    tests/test_jl_focus.py). None: no cap.
    """
    if focus is None or not math.isfinite(focus[1]):
        return None
    return float(focus[1]) + CAP_MARGIN


@dataclass(frozen=True)
class GridPlan:
    """The spacing h and, per mechanism (in the order of the events), its grid."""

    h: float
    tail_mass: float
    grids: tuple[Grid, ...]


def exact_divisor(anchor: float, k: int, floor: float) -> float:
    """h within 4 ulp of anchor / j with j * h == anchor in float64 and h >= floor, for
    the first j of k, k + 1, ..., k + 15 (finer) or else of k - 1, ..., k - 15 (coarser)
    that has one: the grid point j h is then the anchor itself, not an ulp off (an atom
    there is not split, nor rounded down a whole cell). Else anchor / k. Halving h keeps
    the property."""
    for j in [*range(k, k + 16), *range(k - 1, max(k - 16, 0), -1)]:
        candidates = [anchor / j]
        up = down = candidates[0]
        for _ in range(4):
            up, down = math.nextafter(up, math.inf), math.nextafter(down, 0.0)
            candidates += [up, down]
        for h in candidates:
            if j * h == anchor and h >= floor:
                return h
    return anchor / k


def lattice_spacing(atoms: np.ndarray) -> float | None:
    """The largest spacing a = A / j (A the largest |atom|, j = 1..LATTICE_DIVISORS, or
    a few ulp off that quotient) with every atom exactly float(m) * a for an integer m,
    the value of grid point m (:attr:`fdp.pld.cells.Grid.points`); None if there is
    none, or no non-zero atom. Halving a keeps the property (2m * (a/2) == m * a)."""
    atoms = np.asarray(atoms, dtype=np.float64).ravel()
    top = float(np.max(np.abs(atoms))) if atoms.size else 0.0
    if not (top > 0.0 and math.isfinite(top)):
        return None
    for j in range(1, LATTICE_DIVISORS + 1):
        for a in _near(top / j):
            if round(top / a) * a == top and np.array_equal(np.rint(atoms / a) * a, atoms):
                return a
    return None


def _near(x: float, ulps: int = 4) -> list[float]:
    """x and the floats up to ``ulps`` ulp above and below it, nearest first."""
    out, up, down = [x], x, x
    for _ in range(ulps):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, 0.0)
        out += [up, down]
    return out


def _lattice(events: Sequence[tuple[Any, int]], direction: Direction) -> float | None:
    """The common lattice spacing of the events' atoms (:func:`lattice_spacing`), or None
    when some event's loss is not purely atomic."""
    atoms = [m.loss_atoms(direction) for m, _ in events]
    if any(a is None for a in atoms):
        return None
    return lattice_spacing(np.concatenate(atoms))


def _capped(lo: float, hi: float, cap: float | None) -> tuple[float, float]:
    return (lo, hi) if cap is None else (lo, max(min(hi, cap), lo))


def composed_sd(events: Sequence[tuple[Any, int]], direction: Direction, tail_mass: float,
                cap: float | None = None) -> float:
    """sd of the composed loss, sum over the events of c * Var(one step), from a coarse
    pessimistic discretisation of each step (of its finite part below ``cap``)."""
    step_tail = max(tail_mass / sum(c for _, c in events), 1e-300)
    ranges = [_capped(*m.loss_range(direction, step_tail), cap) for m, _ in events]
    check_composable(events, ranges)
    sds = []
    for (m, c), (lo, hi) in zip(events, ranges):
        hc = max((hi - lo) / COARSE_POINTS, 1e-12)
        pld = discretise_pessimistic(m.loss_cells(direction, Grid.covering(lo, hi, hc), pessimistic=True))
        # the variance in grid units, times hc: a loss sd above 1e154 (Laplace at scale
        # 1e-200) squares to inf, and then h = inf
        units = dataclasses.replace(pld, h=1.0).variance()
        sds.append(math.sqrt(c * max(units, 0.0)) * hc)
    top = max(sds)
    return top * math.sqrt(sum((sd / top) ** 2 for sd in sds)) if top > 0.0 else 0.0


def check_composable(events: Sequence[tuple[Any, int]], ranges: Sequence[tuple[float, float]]) -> None:
    """Refuse a composition whose privacy loss can exceed :data:`MAX_COMPOSED_LOSS`
    (steps times each event's largest |loss| in ``ranges``), naming the steps that fit."""
    tops = [max(abs(lo), abs(hi)) for lo, hi in ranges]
    reach = sum(c * top for (_, c), top in zip(events, tops))
    if reach <= MAX_COMPOSED_LOSS:
        return
    big = max(range(len(events)), key=lambda i: events[i][1] * tops[i])
    mech, steps = events[big]
    fits = math.floor(MAX_COMPOSED_LOSS / tops[big]) if math.isfinite(tops[big]) else 0
    if fits >= 1:
        raise ValueError(f"steps must be at most {fits} for {mech!r}: its privacy loss reaches {tops[big]:.3g} "
                         f"per step, and a composition's must stay within {MAX_COMPOSED_LOSS:g} (float64); "
                         f"got {steps} steps (all events together: {reach:.3g})")
    raise ValueError(f"{mech!r} has a privacy loss of {tops[big]:.3g} in one step, beyond the "
                     f"{MAX_COMPOSED_LOSS:g} that float64 grids hold; use a mechanism with more noise")


def grid_plan(events: Sequence[tuple[Any, int]], direction: Direction, tail_mass: float, level: int, *,
              grid_spacing: float | None, grid_scale: float, max_points: int, sd: float | None,
              cap: float | None = None) -> GridPlan:
    """The grids for ``events`` ((mechanism, steps) pairs) in ``direction``, each cut at
    ``cap`` (:func:`query_cap`)."""
    total_steps = sum(c for _, c in events)
    step_tail = tail_mass / total_steps
    ranges = [_capped(*m.loss_range(direction, max(step_tail, 1e-300)), cap) for m, _ in events]
    check_composable(events, ranges)
    if grid_spacing is not None:
        h = grid_spacing
        top = max(max(abs(lo), abs(hi)) for lo, hi in ranges)
        if top / h > MAX_GRID_INDEX:
            raise ValueError(f"grid_spacing must be at least {top / MAX_GRID_INDEX:.3g} for these mechanisms "
                             f"(their privacy loss reaches {top:.3g}, and grid indices loss / grid_spacing "
                             f"must stay within 2^52); got {h:g}")
    else:
        assert sd is not None
        # the composed window (~ +-20 sd around the mean) must fit max_points, and
        # a single step's loss range must fit MAX_STEP_POINTS (e.g. sigma = 1e-6)
        floor = max(40.0 * sd / max_points, MIN_SPACING, max(hi - lo for lo, hi in ranges) / MAX_STEP_POINTS)
        h0 = max(grid_scale * sd / math.sqrt(total_steps), floor)
        lattice = _lattice(events, direction)
        if lattice is not None and lattice >= h0:
            h = lattice  # every atom on the grid: exact at every level, no finer grid needed
        else:
            # put the main mechanism's atom on the grid (discretisation is exact
            # there); the halvings of refinement keep it on
            anchor = max(events, key=lambda ev: ev[1])[0].grid_anchor(direction)
            # (not an atom 2^52 grid points out, beyond every range: RR(1e300) at p = 1e-300,
            # whose atom's mass is in the tail, made the index inf)
            if anchor is not None and h0 <= abs(anchor) <= h0 * MAX_GRID_INDEX:
                # k = floor(...): anchor / k >= h0 >= floor; the search only refines from there
                h0 = exact_divisor(abs(anchor), math.floor(abs(anchor) / h0), floor)
            h = max(h0 / 2.0**level, floor)
    grids = []
    for lo, hi in ranges:
        # a range too long for h (a fixed grid_spacing, a heavy tail) is cut: the
        # mass above the grid goes to +inf in the pessimistic cells (sound, looser)
        grids.append(Grid.covering(lo, min(hi, lo + h * MAX_STEP_POINTS), h))
    return GridPlan(h=h, tail_mass=tail_mass, grids=tuple(grids))
