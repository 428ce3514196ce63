"""Grid refinement of one accountant query: halve h where the bracket is widest.

A query composes, per direction, a pessimistic and an optimistic PLD on a grid of
spacing h / 2^level. Every level gives valid bounds (the pessimistic PLD dominates
the composition, the optimistic one is dominated by it), so a query keeps the best
of each side over all the levels it computed: the lowest upper bound and the highest
lower bound. Finer is not always tighter: a floored spacing (``max_points``) or a
larger FFT's round-off charge can loosen a side at a finer level.

While the bracket is wider than the tolerance, ONE side of the direction that sets
the upper bound is refined: the optimistic side first (the merging discretisation
is the looser one), the pessimistic side once the optimistic one has stopped moving,
at most ``max_refinements`` times each. A side whose halving moved it by less than
a quarter of what the bracket still lacks (gap - rtol * upper, for an eps query; the
gap, for a delta query), or made it looser, has converged in h and is not refined
again; one whose value did not change at all (a lower bound still 0) has not resolved
the query yet and is refined on. (Not a quarter of the whole gap: the JL mechanism's
optimistic side moved 7e-4, then 7.5e-4, then 1.2e-3 over three halvings, r = 30,
T = 8, p = 0.125, so a small first move does not mean that the next ones are smaller;
the bracket lacked 8e-4 there. The rule is a heuristic, and the query's warning says
so: atoms off the grid (randomized response beside Gaussians) moved the merging side
by 8.7e-5, then 3.5e-4, of a 6.4e-4 gap; stopping after two small moves instead cost
the heavy tail of fdp.JL at r = 1 a bracket 3x wider, its later focused pass starting
from a level too fine for its floored spacing.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fdp.pld.cells import Direction
from fdp.pld.pmf import DiscretePLD

__all__ = ["PassResult", "delta_pass", "delta_within_tolerance", "epsilon_pass"]

#: side(direction, pessimistic, level) -> the composed PLD of that side.
Side = Callable[[Direction, bool, int], DiscretePLD]


@dataclass(frozen=True)
class PassResult:
    """Bounds of one refinement loop (each the best over the levels computed)."""

    lower: float
    upper: float
    #: The direction whose upper bound is the largest.
    leading: Direction
    #: Each direction's upper bound.
    uppers: dict[Direction, float]
    #: The sides at the levels where the loop stopped (for the round-off checks).
    sides: dict[tuple[Direction, bool], DiscretePLD]
    #: Whether the bracket met the tolerance.
    converged: bool
    #: Each side's best value, and the level where it was reached.
    best: dict[tuple[Direction, bool], tuple[float, int]]
    #: Why a pass that did not converge stopped (None if it converged): "fixed" (a fixed
    #: grid), "refinements" (a side still moving had max_refinements halvings), "points"
    #: (a finer grid needed more than max_points) or "converged-in-h" (halving h no longer
    #: moves the bounds: the rest is the mechanism's cells or the round-off).
    stopped_by: str | None = None


class _Levels:
    """The level of each side, and the best value each side has reached."""

    def __init__(self, side: Side, query: Callable[[DiscretePLD], float], levels: dict,
                 start: dict | None) -> None:
        self.side, self.query, self.level = side, query, levels
        start = start or {}
        self.level.update({key: level for key, (_, level) in start.items()})
        self.best: dict[tuple[Direction, bool], tuple[float, int]] = dict(start)
        #: sides carried over from an earlier pass, not yet computed in this one
        self.carried = set(start)
        self.values: dict[tuple[Direction, bool, int], float] = {}
        self.stalled: set[tuple[Direction, bool]] = set()
        #: sides whose next level would not fit max_points
        self.too_big: set[tuple[Direction, bool]] = set()

    def pld(self, d: Direction, pessimistic: bool) -> DiscretePLD:
        return self.side(d, pessimistic, self.level[(d, pessimistic)])

    def value(self, d: Direction, pessimistic: bool) -> float:
        """The side's value at its level; the best so far is updated (min above, max below)."""
        level = self.level[(d, pessimistic)]
        if (d, pessimistic, level) not in self.values:
            self.values[(d, pessimistic, level)] = self.query(self.pld(d, pessimistic))
        v = self.values[(d, pessimistic, level)]
        key = (d, pessimistic)
        old = self.best.get(key)
        if old is None or self._better(v, old[0], pessimistic):
            self.best[key] = (v, level)
        elif key in self.carried:
            self.stalled.add(key)  # no better than the earlier pass here: this pass will not help it
        self.carried.discard(key)
        return v

    @staticmethod
    def _better(v: float, than: float, pessimistic: bool) -> bool:
        return v < than if pessimistic else v > than

    def bound(self, d: Direction, pessimistic: bool) -> float:
        return self.best[(d, pessimistic)][0]

    def sides(self) -> dict[tuple[Direction, bool], DiscretePLD]:
        return {key: self.pld(*key) for key, lvl in self.level.items() if lvl >= 0}

    def stopped_by(self, d: Direction, refine: bool, converged: bool, max_refinements: int) -> str | None:
        """Why refining direction ``d`` stopped (see :attr:`PassResult.stopped_by`)."""
        if converged:
            return None
        if not refine:
            return "fixed"
        sides = [(d, s) for s in (False, True)]
        if any(key not in self.stalled and self.level[key] >= max_refinements for key in sides):
            return "refinements"
        if any(key in self.too_big for key in sides):
            return "points"
        return "converged-in-h"

    def refine(self, d: Direction, max_refinements: int, lacking: float) -> bool:
        """Halve h on one side of ``d`` (see the module docstring); ``lacking``: how much the
        bracket still has to narrow. False when no side can be refined."""
        open_sides = [s for s in (False, True) if (d, s) not in self.stalled and self.level[(d, s)] < max_refinements]
        if not open_sides:
            return False
        s = open_sides[0]
        before = self.value(d, s)
        self.level[(d, s)] += 1
        try:
            after = self.value(d, s)
        except ValueError:  # the finer grid needs more than max_points: keep this level
            self.level[(d, s)] -= 1
            self.stalled.add((d, s))
            self.too_big.add((d, s))
            return True
        # (an unchanged value, e.g. a lower bound still 0, says that h has not resolved the
        # query yet, not that it has converged)
        small = abs(after - before) < 0.25 * lacking and after != before
        if small or (after != before and not self._better(after, before, s)):
            # converged in h: what is left of the gap is the other side's (or the
            # mechanism's own cells'); or looser (round-off, a floored spacing):
            # refining this side again would not close it
            self.stalled.add((d, s))
        return True


def epsilon_pass(side: Side, directions: Sequence[Direction], delta: float, rtol: float,
                 max_refinements: int, refine: bool, start: dict | None = None) -> PassResult:
    """Bounds on eps(delta) = max over ``directions`` of eps_direction(delta).

    The first direction is computed on the level-0 grid; the others are only
    screened, pessimistically, on a grid 4x coarser (level -2) and computed at level
    0 if one of them leads. ``start`` carries sides over from an earlier pass
    ({side: (best value, level)}, e.g. :attr:`PassResult.best`): they start at that
    level, keep that value as a bound, and are not refined if this pass does no
    better there. With ``refine`` False the levels stay where they are.
    """
    levels = {(d, s): (0 if i == 0 or not refine else -2) for i, d in enumerate(directions) for s in (True, False)}
    state = _Levels(side, lambda pld: pld.epsilon(delta), levels, start)
    while True:
        for d in directions:
            state.value(d, True)
            if levels[(d, False)] >= 0:  # a screened direction's lower bound is not needed
                state.value(d, False)
        uppers = {d: state.bound(d, True) for d in directions}
        hi = max(uppers.values())
        lo = max(state.bound(d, False) for d in directions if (d, False) in state.best)
        d = max(uppers, key=uppers.get)
        if levels[(d, True)] < 0:  # screened only: compute the leading direction properly
            levels[(d, True)] = levels[(d, False)] = 0
            continue
        gap = hi - lo
        converged = math.isfinite(hi) and gap <= rtol * hi  # inf <= rtol * inf is not converged
        if not refine or converged or not math.isfinite(hi):
            break
        if not state.refine(d, max_refinements, gap - rtol * hi):
            break
    return PassResult(lower=lo, upper=hi, leading=d, uppers=uppers, sides=state.sides(), converged=converged,
                      best=dict(state.best),
                      stopped_by=state.stopped_by(d, refine, converged, max_refinements))


def delta_within_tolerance(lo: float, hi: float, epsilon: float, rtol: float, upper: DiscretePLD) -> bool:
    """The tolerance of a delta query: hi - lo <= rtol * hi (relative, as for epsilon), or
    the upper curve (``upper``'s delta) comes down to ``lo`` within rtol * max(eps, 1) of
    eps: as tight as an epsilon bracket would be (a relative gap on delta alone would ask
    far more where delta(eps) is steep, the other alone where it is flat)."""
    if hi <= lo or lo >= 1.0 or hi - lo <= rtol * hi:
        return True
    return lo > 0.0 and upper.epsilon(lo) - epsilon <= rtol * max(epsilon, 1.0)


def delta_pass(side: Side, directions: Sequence[Direction], epsilon: float, rtol: float,
               max_refinements: int, refine: bool, start: dict | None = None) -> PassResult:
    """Bounds on delta(eps) = max over ``directions`` of delta_direction(eps).

    Refined until the bracket is within tolerance (:func:`delta_within_tolerance`).
    ``start`` as in :func:`epsilon_pass`.
    """
    levels = {(d, s): 0 for d in directions for s in (True, False)}
    state = _Levels(side, lambda pld: float(pld.delta(epsilon)), levels, start)
    while True:
        for d in directions:
            state.value(d, True)
            state.value(d, False)
        uppers = {d: state.bound(d, True) for d in directions}
        hi = max(uppers.values())
        lo = max(state.bound(d, False) for d in directions)
        d = max(uppers, key=uppers.get)
        # converged: the upper curve is down to lo within the tolerance of eps
        converged = delta_within_tolerance(lo, hi, epsilon, rtol, state.pld(d, True))
        if not refine or converged:
            break
        if not state.refine(d, max_refinements, hi - lo):
            break
    return PassResult(lower=lo, upper=hi, leading=d, uppers=uppers, sides=state.sides(), converged=converged,
                      best=dict(state.best),
                      stopped_by=state.stopped_by(d, refine, converged, max_refinements))
