"""The PLD accountant: certified (epsilon, delta) for compositions of mechanisms.

For every neighbouring relation (remove, add; DESIGN.md "Two directions") the
accountant discretises each mechanism's privacy-loss distribution twice on one
shared grid of spacing h:

* pessimistically (connect-the-dots): a dominating pair, delta >= truth;
* optimistically (merging): a dominated pair, delta <= truth;

composes each by FFT (:func:`fdp.pld.compose.compose`, wrap-around mass charged
on the safe side) and reads off

    delta(eps) = max(delta_remove(eps), delta_add(eps))        (DESIGN.md)
    eps(delta) = max(eps_remove(delta), eps_add(delta)).

``get_epsilon`` returns the pessimistic value, a certified upper bound;
``get_epsilon_bounds`` returns (optimistic, pessimistic), which bracket the
exact epsilon of the composition. The grid is chosen from the mechanisms and the
number of steps (spacing proportional to sd(composed loss) / sqrt(steps), the
size of each discretisation's per-step error), unless given.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from fdp._validation import check_delta, check_integer, check_real
from fdp.mechanisms.base import Mechanism, mechanism_from_dict
from fdp.pld.cells import Direction, Grid
from fdp.pld.compose import MAX_FFT_POINTS, compose
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic
from fdp.pld.pmf import DiscretePLD

__all__ = ["PLDAccountant"]

#: Largest number of steps accepted (beyond this float64 losses lose meaning).
MAX_STEPS = 10**11
#: Grid points of the coarse discretisation used to size the fine grid.
_COARSE_POINTS = 2000
#: Largest single-step grid.
_MAX_STEP_POINTS = 1 << 22
#: Cells of a single-step optimistic grid cut at a cap (heavy-tail lower bound).
_CAP_POINTS = 1 << 20
#: Successive caps of :meth:`PLDAccountant._capped_lower` grow by this factor.
_CAP_GROWTH = 1000.0


@dataclass(frozen=True)
class _Plan:
    h: float
    tail_mass: float
    grids: tuple[Grid, ...]


@dataclass
class PLDAccountant:
    """Privacy-loss-distribution accountant (both directions, certified bounds).

    Args:
      grid_spacing: loss grid spacing h; ``None`` chooses it from the mechanisms
        and the number of steps.
      grid_scale: tightness knob of the automatic grid, h = grid_scale * sd(L_T) / sqrt(T);
        smaller is tighter and slower.
      epsilon_rtol: ``get_epsilon_bounds`` halves the automatic grid spacing (up to
        ``max_refinements`` times) until (upper - lower) <= epsilon_rtol * upper.
      max_points: largest FFT allowed (bounds memory: 16 bytes per point).

    Example:
      >>> import fdp
      >>> acc = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=1.1,
      ...     sampling_rate=256 / 60000), steps=14100)
      >>> lo, hi = acc.get_epsilon_bounds(delta=1e-5)   # ~ (2.384, 2.386)
    """

    grid_spacing: float | None = None
    grid_scale: float = 0.04
    epsilon_rtol: float = 1e-3
    max_refinements: int = 3
    max_points: int = MAX_FFT_POINTS
    _events: list[tuple[Mechanism, int]] = field(default_factory=list, repr=False)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.grid_spacing is not None:
            self.grid_spacing = check_real("grid_spacing", self.grid_spacing, low=0.0, low_inclusive=False)
        self.grid_scale = check_real("grid_scale", self.grid_scale, low=1e-4, high=10.0)
        self.max_points = check_integer("max_points", self.max_points, low=1024, high=1 << 27)
        self.epsilon_rtol = check_real("epsilon_rtol", self.epsilon_rtol, low=0.0)
        self.max_refinements = check_integer("max_refinements", self.max_refinements, low=0, high=8)

    # ------------------------------------------------------------------ events
    def compose(self, mechanism: Mechanism, steps: int = 1) -> "PLDAccountant":
        """Record ``steps`` independent runs of ``mechanism``; returns self (chainable)."""
        if not isinstance(mechanism, Mechanism):
            raise ValueError(f"mechanism must be an fdp mechanism (e.g. fdp.Gaussian); got {mechanism!r}")
        steps = check_integer("steps", steps, low=1, high=MAX_STEPS)
        if self._events and self._events[-1][0] == mechanism:
            self._events[-1] = (mechanism, self._events[-1][1] + steps)
        else:
            self._events.append((mechanism, steps))
        self._cache.clear()
        return self

    @property
    def events(self) -> tuple[tuple[Mechanism, int], ...]:
        return tuple(self._events)

    @property
    def steps(self) -> int:
        return sum(c for _, c in self._events)

    def _grouped(self) -> list[tuple[Mechanism, int]]:
        """Events with equal mechanisms merged (composition is commutative)."""
        counts: dict[Mechanism, int] = {}
        for m, c in self._events:
            counts[m] = counts.get(m, 0) + c
        return list(counts.items())

    def _directions(self) -> tuple[Direction, ...]:
        events = self._grouped()
        if all(m.is_symmetric() and m.sampling_rate == 1.0 for m, _ in events):
            return (Direction.REMOVE,)
        return (Direction.REMOVE, Direction.ADD)

    # ---------------------------------------------------------------- queries
    def get_epsilon(self, delta: float) -> float:
        """Certified upper bound on epsilon at ``delta`` (both directions)."""
        return self.get_epsilon_bounds(delta)[1]

    def get_epsilon_bounds(self, delta: float) -> tuple[float, float]:
        """(lower, upper) bounds on the exact epsilon at ``delta``.

        With two directions, remove is computed on the automatic grid (level 0)
        and add only screened, pessimistically, on a grid 4x coarser (level -2);
        add is recomputed at level 0 only if its coarse upper bound is the larger. While the gap exceeds the tolerance, ONE side of the
        direction that sets the upper bound is refined (grid halved): the
        optimistic side first (the merging discretisation is the looser one), the
        pessimistic side once the optimistic one has stopped moving; at most
        ``max_refinements`` times each. The tolerance is ``epsilon_rtol * upper``,
        or the mechanisms' own ``intrinsic_rtol`` if larger (a mechanism known only
        up to a bound, like the JL mechanism, has a gap no grid can close). If the
        bounds end more than 2x apart (a heavy upper tail stretched the grid, as
        for ``fdp.JL`` with r = 1), the lower bound is recomputed on grids cut at a
        cap (:meth:`_capped_lower`). Every value computed is a valid bound,
        whatever its level.
        """
        delta = check_delta(delta)
        self._require_events()
        tail = _tail_budget(delta)
        refine = self.grid_spacing is None
        directions = self._directions()
        rtol = max([self.epsilon_rtol] + [m.intrinsic_rtol for m, _ in self._grouped()])
        inexact = rtol > self.epsilon_rtol
        # remove first (it leads for eps >= 0 in the usual cases); the other
        # direction is screened on a 4x coarser grid
        level = {(d, s): (0 if i == 0 or not refine else -2) for i, d in enumerate(directions)
                 for s in (True, False)}
        stalled: set[tuple[Direction, bool]] = set()

        def value(d: Direction, pessimistic: bool) -> float:
            return self._side(d, pessimistic, tail, level[(d, pessimistic)]).epsilon(delta)

        while True:
            his = {d: value(d, True) for d in directions}
            # a screened direction's lower bound is not needed: the leader's is valid for the max
            los = {d: value(d, False) for d in directions if level[(d, False)] >= 0}
            hi, lo = max(his.values()), max(los.values())
            gap = hi - lo
            d = max(his, key=his.get)
            if hi == math.inf:
                self._refuse_below_round_off(delta, tail, {k: v for k, v in level.items() if k[1]})
            if level[(d, True)] < 0:  # screened only: compute the leading direction properly
                level[(d, True)] = level[(d, False)] = 0
                continue
            if not refine or gap <= rtol * hi or not math.isfinite(hi):
                break
            if not self._refine_one_side(d, level, stalled, value, (los[d], his[d]), gap, inexact):
                break
        if refine and lo < 0.5 * hi:  # a heavy upper tail made the grid coarse
            lo = max(lo, self._capped_lower(d, delta, tail, lo, hi))
        return _reported(lo, hi, delta, rtol)

    def _capped_lower(self, direction: Direction, delta: float, tail_mass: float,
                      lower: float, upper: float) -> float:
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
        events = self._grouped()
        steps = sum(c for _, c in events)
        top = max(m.loss_range(direction, max(tail_mass / steps, 1e-300))[1] for m, _ in events)
        best = lower
        cap = 10.0 * max(lower, 10.0)
        while cap < top:
            if math.isfinite(upper):
                cap = min(cap, 4.0 * upper)
            key = ("capped", direction, tail_mass, cap)
            if key not in self._cache:
                plds = capped_optimistic_plds([m for m, _ in events], direction, tail_mass / steps, cap)
                self._cache[key] = compose([(pld, c) for pld, (_, c) in zip(plds, events)],
                                           pessimistic=False, tail_mass=tail_mass,
                                           max_points=self.max_points)
            found = self._cache[key].epsilon(delta)
            best = max(best, found)
            if found < 0.1 * cap or (math.isfinite(upper) and cap >= 4.0 * upper):
                break
            cap *= _CAP_GROWTH
        return best

    def get_delta(self, epsilon: float) -> float:
        """Certified upper bound on delta at ``epsilon``."""
        return self.get_delta_bounds(epsilon)[1]

    def get_delta_bounds(self, epsilon: float) -> tuple[float, float]:
        """(lower, upper) bounds on the exact delta at ``epsilon`` (epsilon >= 0).

        Refined like :meth:`get_epsilon_bounds` (one side of the leading direction
        at a time, the optimistic side first, at most ``max_refinements`` halvings)
        until the bracket is as tight as an epsilon bracket would be: the upper
        curve must come down to the lower bound ``lo`` within
        ``epsilon_rtol * max(epsilon, 1)`` of ``epsilon`` (a relative gap on delta
        itself would ask far more where delta(eps) is steep). The tolerance is the
        mechanisms' ``intrinsic_rtol`` if larger. Every value is a valid bound.
        """
        epsilon = check_real("epsilon", epsilon, low=0.0)
        self._require_events()
        tail = 1e-15
        refine = self.grid_spacing is None
        directions = self._directions()
        rtol = max([self.epsilon_rtol] + [m.intrinsic_rtol for m, _ in self._grouped()])
        inexact = rtol > self.epsilon_rtol
        level = {(d, s): 0 for d in directions for s in (True, False)}
        stalled: set[tuple[Direction, bool]] = set()

        def value(d: Direction, pessimistic: bool) -> float:
            return float(self._side(d, pessimistic, tail, level[(d, pessimistic)]).delta(epsilon))

        while True:
            his = {d: value(d, True) for d in directions}
            los = {d: value(d, False) for d in directions}
            hi, lo = max(his.values()), max(los.values())
            d = max(his, key=his.get)
            if not refine or hi <= lo or lo >= 1.0:
                return lo, hi
            upper = self._side(d, True, tail, level[(d, True)])
            reach = upper.epsilon(lo) if lo > 0.0 else math.inf  # where the upper curve is down to lo
            if reach - epsilon <= rtol * max(epsilon, 1.0):
                return lo, hi
            if not self._refine_one_side(d, level, stalled, value, (los[d], his[d]), hi - lo, inexact):
                return lo, hi

    def _refine_one_side(self, d: Direction, level: dict, stalled: set, value: Any,
                         before: tuple[float, float], gap: float, inexact: bool) -> bool:
        """Halve h on one side of direction ``d``: the optimistic side first (the merging
        discretisation is the looser one), the pessimistic side once it has stalled.
        ``before`` is the (optimistic, pessimistic) value at the current levels. Returns
        False when no side can be refined any more."""
        sides = [s for s in (False, True) if (d, s) not in stalled and level[(d, s)] < self.max_refinements]
        if not sides:
            return False
        side = sides[0]
        level[(d, side)] += 1
        try:
            after = value(d, side)
        except ValueError:  # the finer grid needs more than max_points: keep this level
            level[(d, side)] -= 1
            stalled.add((d, side))
            return True
        if abs(after - before[int(side)]) < 0.25 * gap and inexact:
            # converged in h: the rest of the gap is the mechanism's own (intrinsic_rtol)
            stalled.add((d, side))
        return True

    def composed_pld(self, direction: Direction | str = "remove", *, pessimistic: bool = True,
                     tail_mass: float = 1e-15) -> DiscretePLD:
        """The composed discrete PLD of one direction (upper or lower bound)."""
        self._require_events()
        return self._side(Direction(direction), bool(pessimistic), tail_mass)

    def tradeoff(self):
        """The composed g = min{f, f^-1}** as a TradeoffCurve (pessimistic side).

        f is the tradeoff curve of the remove direction's composed pessimistic PLD,
        f^-1 that of the add direction; both are exact piecewise-linear curves of
        dominating discrete pairs, so g lies below the true curve.
        """
        from fdp.tradeoff import PiecewiseLinearCurve

        self._require_events()
        curves = []
        for d in self._directions():
            pld = self.composed_pld(d, pessimistic=True)
            curve = PiecewiseLinearCurve.from_privacy_loss_atoms(pld.losses, pld.pmf, p_inf=pld.p_inf)
            curves.append(curve if d is Direction.REMOVE else curve.inverse())
        if len(curves) == 1:
            return curves[0].symmetrized()
        from fdp.tradeoff import convex_minimum

        return convex_minimum(curves[0], curves[1]).symmetrized()

    # ----------------------------------------------------------- persistence
    def to_json(self) -> str:
        """The composed mechanisms and settings as JSON (no pickles)."""
        return json.dumps({
            "format": "fdp.PLDAccountant/1",
            "grid_spacing": self.grid_spacing,
            "grid_scale": self.grid_scale,
            "epsilon_rtol": self.epsilon_rtol,
            "max_refinements": self.max_refinements,
            "max_points": self.max_points,
            "events": [{"mechanism": m.to_dict(), "steps": c} for m, c in self._events],
        })

    @classmethod
    def from_json(cls, text: str) -> "PLDAccountant":
        data = json.loads(text)
        if data.get("format") != "fdp.PLDAccountant/1":
            raise ValueError(f"not an fdp.PLDAccountant JSON document (format={data.get('format')!r})")
        acc = cls(grid_spacing=data["grid_spacing"], grid_scale=data["grid_scale"],
                  epsilon_rtol=data.get("epsilon_rtol", 1e-3),
                  max_refinements=data.get("max_refinements", 3), max_points=data["max_points"])
        for ev in data["events"]:
            acc.compose(mechanism_from_dict(ev["mechanism"]), steps=ev["steps"])
        return acc

    # ------------------------------------------------------------- internals
    def _require_events(self) -> None:
        if not self._events:
            raise ValueError("the accountant is empty: call compose(mechanism, steps) first")

    def _refuse_below_round_off(self, delta: float, tail: float, levels: dict) -> None:
        """ValueError when float round-off of the FFT alone reaches ``delta``."""
        noise = max(self._side(d, True, tail, lv).round_off for (d, _), lv in levels.items())
        if noise >= 0.5 * delta:
            raise ValueError(
                f"delta={delta:.3g} is below what float64 FFT composition can certify here: its "
                f"round-off alone is ~{noise:.1e}; ask for delta >= {10 * noise:.0e}"
            )

    def _side(self, direction: Direction, pessimistic: bool, tail_mass: float, level: int = 0) -> DiscretePLD:
        """Composed pessimistic or optimistic PLD of one direction; ``level`` halves h."""
        key = ("side", direction, pessimistic, tail_mass, level)
        if key not in self._cache:
            plan = self._plan(direction, tail_mass, level)
            discretise = discretise_pessimistic if pessimistic else discretise_optimistic
            parts = [(discretise(self._cells(m, direction, grid, pessimistic)), c)
                     for (m, c), grid in zip(self._grouped(), plan.grids)]
            self._cache[key] = compose(parts, pessimistic=pessimistic, tail_mass=tail_mass,
                                       max_points=self.max_points)
        return self._cache[key]

    def _cells(self, mechanism: Mechanism, direction: Direction, grid: Grid, pessimistic: bool):
        """Loss cells, shared by both sides when the mechanism's cells are exact."""
        key = ("cells", mechanism, direction, grid, None if mechanism.exact_cells else pessimistic)
        if key not in self._cache:
            self._cache[key] = mechanism.loss_cells(direction, grid, pessimistic=pessimistic)
        return self._cache[key]

    def _moments(self, direction: Direction, tail_mass: float) -> float:
        """sd of the composed loss from a coarse pessimistic discretisation."""
        key = ("sd", direction, tail_mass)
        if key not in self._cache:
            events = self._grouped()
            step_tail = max(tail_mass / sum(c for _, c in events), 1e-300)
            var = 0.0
            for m, c in events:
                lo, hi = m.loss_range(direction, step_tail)
                hc = max((hi - lo) / _COARSE_POINTS, 1e-12)
                cells = m.loss_cells(direction, Grid.covering(lo, hi, hc), pessimistic=True)
                var += c * discretise_pessimistic(cells).variance()
            self._cache[key] = math.sqrt(max(var, 0.0))
        return self._cache[key]

    def _plan(self, direction: Direction, tail_mass: float, level: int = 0) -> _Plan:
        events = self._grouped()
        total_steps = sum(c for _, c in events)
        step_tail = tail_mass / total_steps
        ranges = [m.loss_range(direction, max(step_tail, 1e-300)) for m, _ in events]
        if self.grid_spacing is not None:
            h = self.grid_spacing
        else:
            sd = self._moments(direction, tail_mass)
            # the composed window (~ +-20 sd around the mean) must fit max_points, and
            # a single step's loss range must fit _MAX_STEP_POINTS (e.g. sigma = 1e-6)
            floor = max(40.0 * sd / self.max_points, 1e-9, max(hi - lo for lo, hi in ranges) / _MAX_STEP_POINTS)
            h0 = max(self.grid_scale * sd / math.sqrt(total_steps), floor)
            # put the main mechanism's atom on the grid (discretisation is exact
            # there); the halvings of refinement keep it on
            anchor = max(events, key=lambda ev: ev[1])[0].grid_anchor(direction)
            if anchor is not None and abs(anchor) >= h0:
                h0 = abs(anchor) / math.ceil(abs(anchor) / h0)
            h = max(h0 / 2.0**level, floor)
        grids = []
        for lo, hi in ranges:
            # a range too long for h (a fixed grid_spacing, a heavy tail) is cut: the
            # mass above the grid goes to +inf in the pessimistic cells (sound, looser)
            grids.append(Grid.covering(lo, min(hi, lo + h * _MAX_STEP_POINTS), h))
        return _Plan(h=h, tail_mass=tail_mass, grids=tuple(grids))


def capped_optimistic_plds(mechanisms: list[Mechanism], direction: Direction, step_tail: float,
                           cap: float) -> list[DiscretePLD]:
    """Optimistic single-step PLDs on one grid cut at the loss ``cap`` (2^20 cells).

    The mass above ``cap`` sits on the top grid point: losses only decrease, so
    every composition of these PLDs has delta(eps) <= the truth (a lower bound).
    """
    ranges = [m.loss_range(direction, max(step_tail, 1e-300)) for m in mechanisms]
    bottom = min(lo for lo, _ in ranges)
    h = (cap - bottom) / _CAP_POINTS
    return [discretise_optimistic(m.loss_cells(direction, Grid.covering(lo, min(hi, cap), h), pessimistic=False))
            for m, (lo, hi) in zip(mechanisms, ranges)]


def _reported(lo: float, hi: float, delta: float, rtol: float) -> tuple[float, float]:
    """(lo, hi), with a warning when the bounds are not as tight as asked."""
    if hi == math.inf:
        warnings.warn(
            f"the certified upper bound on epsilon at delta={delta:.3g} is inf: the composed "
            f"privacy loss is +inf (or beyond the grid) with probability >= delta. Heavy-tailed "
            f"mechanisms (e.g. fdp.JL with few jl_projections) do this; lower bound: {lo:.6g}",
            stacklevel=3,
        )
    elif hi - lo > rtol * hi:
        warnings.warn(
            f"epsilon bounds [{lo:.6g}, {hi:.6g}] are wider than the relative tolerance {rtol:g}; "
            f"pass a smaller grid_spacing, or raise max_points / max_refinements",
            stacklevel=3,
        )
    return lo, hi


def _tail_budget(delta: float) -> float:
    """Mass each FFT tail may hold: 1e-4 of delta (it moves epsilon by ~1e-4 / |d log delta / d eps|)."""
    return max(1e-4 * delta, 1e-300)
