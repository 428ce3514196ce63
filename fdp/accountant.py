"""The PLD accountant: certified (epsilon, delta) for compositions of mechanisms.

For every neighbouring relation (remove, add; docs/accountant.md, "What it computes") the
accountant discretises each mechanism's privacy-loss distribution twice on one
shared grid of spacing h:

* pessimistically (connect-the-dots): a dominating pair, delta >= truth;
* optimistically (merging): a dominated pair, delta <= truth;

composes each by FFT (:func:`fdp.pld.compose.compose`, wrap-around mass charged
on the safe side) and reads off

    delta(eps) = max(delta_remove(eps), delta_add(eps))        (docs/accountant.md)
    eps(delta) = max(eps_remove(delta), eps_add(delta)).

``get_epsilon`` returns the pessimistic value, a certified upper bound;
``get_epsilon_bounds`` returns (optimistic, pessimistic), which bracket the
exact epsilon of the composition. The grid is chosen from the mechanisms and the
number of steps (spacing proportional to sd(composed loss) / sqrt(steps), the
size of each discretisation's per-step error), unless given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


from fdp._kernels import prefetch
from fdp._validation import check_integer, check_real
from fdp.mechanisms.base import RELATIONS, Mechanism
from fdp.persistence import accountant_from_json, accountant_to_json
from fdp.pld.cells import Direction, Grid
from fdp.pld.capped import capped_lower_epsilon
from fdp.pld.capped_compose import compose_for_query
from fdp.pld.chernoff import chernoff_epsilon, saddle_tilt
from fdp.pld.compose import MAX_FFT_POINTS
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic
from fdp.pld.plan import MAX_COMPOSED_LOSS, MIN_SPACING, GridPlan, composed_sd, grid_plan, query_cap
from fdp.pld.pmf import DiscretePLD
from fdp.pld.refinement import PassResult, delta_pass, epsilon_pass
from fdp.pld.queries import (
    check_certifiable_delta,
    gap_unwarned,
    reported,
    reported_delta,
    round_off_matters,
    round_off_moves_epsilon,
    support_top,
    tail_budget,
    widening_advice,
)

__all__ = ["PLDAccountant"]

#: Largest number of steps accepted (beyond this float64 losses lose meaning).
MAX_STEPS = 10**11
#: Largest grid_spacing: MAX_STEPS steps of a few cells each stay within MAX_COMPOSED_LOSS.
MAX_GRID_SPACING = MAX_COMPOSED_LOSS / (1000 * MAX_STEPS)
#: Tilted passes of get_epsilon_bounds at most (each re-aimed at the eps found).
_TILT_PASSES = 2


#: The settings a JSON document carries (missing ones take their defaults).
_SETTINGS = ("grid_spacing", "grid_scale", "epsilon_rtol", "max_refinements", "max_points")




@dataclass
class PLDAccountant:
    """Privacy-loss-distribution accountant (both directions, certified bounds).

    Args:
      grid_spacing: loss grid spacing h in [1e-9, 1e292]; ``None`` chooses it from the
        mechanisms and the number of steps. A query refuses an h too fine for its
        mechanisms' losses (loss / h beyond 2^52).
      grid_scale: tightness knob of the automatic grid, h = grid_scale * sd(L_T) / sqrt(T);
        smaller is tighter and slower.
      epsilon_rtol: ``get_epsilon_bounds`` halves the automatic grid spacing (up to
        ``max_refinements`` times) until (upper - lower) <= epsilon_rtol * upper, and
        warns if it is still wider; ``get_delta_bounds`` likewise, to the tolerance in
        its docstring.
      max_refinements: the most halvings of the grid spacing per side, in [0, 8]; more
        is tighter and slower (0: the automatic grid only).
      max_points: largest FFT allowed (bounds memory: 16 bytes per point).

    Examples:
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
    _events: list[tuple[Mechanism, int]] = field(default_factory=list, init=False, repr=False)
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.grid_spacing is not None:
            self.grid_spacing = check_real("grid_spacing", self.grid_spacing, low=MIN_SPACING, high=MAX_GRID_SPACING)
        self.grid_scale = check_real("grid_scale", self.grid_scale, low=1e-4, high=10.0)
        self.max_points = check_integer("max_points", self.max_points, low=1024, high=1 << 27)
        self.epsilon_rtol = check_real("epsilon_rtol", self.epsilon_rtol, low=0.0)
        self.max_refinements = check_integer("max_refinements", self.max_refinements, low=0, high=8)

    def fresh(self) -> "PLDAccountant":
        """A new accountant with these settings and no events."""
        return PLDAccountant(**{name: getattr(self, name) for name in _SETTINGS})

    # ------------------------------------------------------------------ events
    def compose(self, mechanism: Mechanism, steps: int = 1) -> "PLDAccountant":
        """Record ``steps`` independent runs of ``mechanism``; returns self (chainable)."""
        if not isinstance(mechanism, Mechanism):
            raise ValueError(f"mechanism must be an fdp mechanism (e.g. fdp.Gaussian); got {mechanism!r}")
        steps = check_integer("steps", steps, low=1, high=MAX_STEPS)
        if self._events and mechanism.neighboring != self.neighboring:
            raise ValueError(
                f"mechanism is accounted for neighbouring data sets that differ by {RELATIONS[mechanism.neighboring]}, "
                f"but this accountant already holds mechanisms for {RELATIONS[self.neighboring]}: one epsilon "
                f"cannot hold for both relations. Account them in separate accountants; got {mechanism!r}")
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
    def neighboring(self) -> str:
        """The neighbouring relation the bounds are for: "add_remove" (one example added
        or removed; also when empty) or "replace_one" (fdp.SampledWithoutReplacement)."""
        return self._events[0][0].neighboring if self._events else "add_remove"

    @property
    def steps(self) -> int:
        return sum(c for _, c in self._events)

    def _grouped(self) -> list[tuple[Mechanism, int]]:
        """Events as the mechanisms they compose (:meth:`Mechanism.parts`), equal ones
        merged (composition is commutative) and null mechanisms (``is_null``: loss
        exactly 0) left out, since composing them is the identity; if every mechanism is
        null, one step of one of them stands for all."""
        counts: dict[Mechanism, int] = {}
        for event, c in self._events:
            for m, times in event.parts():
                counts[m] = counts.get(m, 0) + c * times
        kept = [(m, c) for m, c in counts.items() if not m.is_null()]
        return kept or [(next(iter(counts)), 1)]

    def _directions(self) -> tuple[Direction, ...]:
        events = self._grouped()
        if all(m.is_symmetric() and m.sampling_rate == 1.0 for m, _ in events):
            return (Direction.REMOVE,)
        return (Direction.REMOVE, Direction.ADD)

    # ---------------------------------------------------------------- queries
    def get_epsilon(self, delta: float) -> float:
        """Certified upper bound on epsilon at ``delta`` (both directions)."""
        with gap_unwarned():  # only the upper bound was asked for
            return self.get_epsilon_bounds(delta)[1]

    def get_epsilon_bounds(self, delta: float) -> tuple[float, float]:
        """(lower, upper) bounds on the exact epsilon at ``delta``.

        With two directions, remove is computed on the automatic grid and add only
        screened, pessimistically, on a grid 4x coarser; add is recomputed on the
        automatic grid only if its coarse upper bound is the larger.
        While the gap exceeds ``epsilon_rtol * upper``, one side of the leading
        direction is refined (grid halved; :mod:`fdp.pld.refinement`), and each side
        keeps the best value of all its levels: every value computed is a valid bound.

        If the bracket is still too wide, one more pass is *focused* on it: every step's
        grid is cut at its upper end + 40 (:func:`fdp.pld.plan.query_cap`: sound, and
        within e^-40 relative), and mechanisms whose cells are bounds (``fdp.JL``) make
        them finer where one step's loss reaches the bracket (docs/jl.md, "Cells at the
        query's focus"). The FFT's float round-off has a proven bound
        (:mod:`fdp.pld.roundoff`); where it moves a side's eps noticeably (delta below
        ~1e-9, or huge FFTs), that side's FFTs are redone on exponentially tilted PLDs
        aimed at the eps found (:func:`fdp.pld.compose.compose`), which makes the
        round-off relative to delta: certified down to delta = 1e-290. If the bounds end
        more than 2x apart (a heavy upper tail, as for ``fdp.JL`` with r = 1), the lower
        bound is recomputed on grids cut at growing caps (each cut is again a valid
        lower bound: the mass above the cap is put at the cap, moved down only).

        Raises:
          ValueError: delta outside [1e-290, 1).
        """
        delta = check_certifiable_delta(delta)
        self._start_query()
        tail = tail_budget(delta)
        rtol = self.epsilon_rtol
        result = self._epsilon_pass(delta, tail, rtol, {})
        focus = None
        if not result.converged and math.isfinite(result.upper) and self._focusable(
                (result.lower, result.upper), tail):
            # grids cut above the bracket, cells focused on it; each side starts at its best level
            focus = (result.lower, result.upper)
            result = self._epsilon_pass(delta, tail, rtol, {}, focus, start=result.best)
        tilts: dict[tuple[Direction, bool], float] = {}  # per side; absent: untilted
        for _ in range(_TILT_PASSES):
            # a pessimistic side at eps = inf is tilted too: its round-off shift reads 0 there
            # (all its charge is in p_inf, clipped at 1), but a tilted FFT may bring it down
            moving = [key for key, pld in result.sides.items()
                      if round_off_moves_epsilon(pld, delta, rtol, result.upper)
                      or (key[1] and not math.isfinite(result.uppers[key[0]]))]
            # tilt those sides' FFTs towards their direction's eps found (or a Chernoff bound on it)
            aims = {k: result.uppers[k] if math.isfinite(result.uppers[k]) else
                    chernoff_epsilon(self._parts(k, True, tail, 0), delta) for k, _ in moving}
            new = {(k, s): self._tilt(k, aims[k], tail, s) for k, s in moving}
            if all(tilts.get(key) == t for key, t in new.items()):
                break  # nothing moves, or the same tilts again
            tilts = {**tilts, **new}
            # every side starts where it did best (and keeps that bound): the coarser levels were not enough
            result = self._epsilon_pass(delta, tail, rtol, tilts, focus, start=result.best)
        lo, hi = result.lower, min(result.upper, self._support_top(tail, result.best))
        if self.grid_spacing is None and lo < 0.5 * hi:  # a heavy upper tail made the grid coarse
            lo = max(lo, self._capped_lower(result.leading, delta, tail, lo, hi))
        return reported(lo, hi, delta, rtol, self._advice(result))

    def _epsilon_pass(self, delta: float, tail: float, rtol: float, tilts: dict,
                      focus: tuple[float, float] | None = None, start: dict | None = None) -> PassResult:
        """One refinement loop (:func:`fdp.pld.refinement.epsilon_pass`, which carries the
        sides of ``start`` over); the FFTs of side (direction, pessimistic) are tilted by
        ``tilts.get(side, 0)``, the mechanisms' cells focused on ``focus``."""
        def side(d: Direction, pessimistic: bool, level: int) -> DiscretePLD:
            return self._side(d, pessimistic, tail, level, tilts.get((d, pessimistic), 0.0), focus)

        return epsilon_pass(side, self._directions(), delta, rtol, self.max_refinements,
                            refine=self.grid_spacing is None, start=start)

    def _tilt(self, direction: Direction, epsilon: float, tail: float, pessimistic: bool) -> float:
        """Saddle-point tilt for ``epsilon`` of one direction's composition (level 0 grid)."""
        return saddle_tilt(self._parts(direction, True, tail, 0), epsilon, below_top=not pessimistic)

    def _capped_lower(self, direction: Direction, delta: float, tail_mass: float,
                      lower: float, upper: float) -> float:
        """A lower bound on epsilon from optimistic grids cut at growing caps
        (:func:`fdp.pld.capped.capped_lower_epsilon`), cached per cap."""
        return capped_lower_epsilon(self._grouped(), direction, delta, tail_mass, lower, upper,
                                    self.max_points, self._cache)

    def get_delta(self, epsilon: float) -> float:
        """Certified upper bound on delta at ``epsilon``."""
        with gap_unwarned():
            return self.get_delta_bounds(epsilon)[1]

    def get_delta_bounds(self, epsilon: float) -> tuple[float, float]:
        """(lower, upper) bounds on the exact delta at ``epsilon`` (epsilon >= 0).

        Refined like :meth:`get_epsilon_bounds` (one side of the leading direction
        at a time, at most ``max_refinements`` halvings, each side's best level kept)
        until the bracket is within the tolerance of a delta query: (upper - lower)
        <= epsilon_rtol * upper, or as tight as an epsilon bracket would be (the upper
        curve comes down to the lower bound within ``epsilon_rtol * max(epsilon, 1)``
        of ``epsilon``; a relative gap on delta alone would ask far more where
        delta(eps) is steep). Where the bracket is still too wide, a pass focused on
        ``epsilon`` follows (grids cut at ``epsilon`` + 40, approximate cells refined
        there); where the FFT round-off or the grids' tails are not small against
        delta, the FFTs are redone tilted towards ``epsilon``, tails cut in proportion
        to delta (as in :meth:`get_epsilon_bounds`). A bracket still wider than the
        tolerance is returned with a warning that names the setting that narrows it.
        """
        epsilon = check_real("epsilon", epsilon, low=0.0)
        self._start_query()
        tail = 1e-15
        if epsilon >= self._support_top(tail, {}):
            return 0.0, 0.0  # no composed loss exceeds epsilon: delta is exactly 0
        rtol = self.epsilon_rtol
        tilts: dict[tuple[Direction, bool], float] = {}
        result = self._delta_pass(epsilon, rtol, tilts, tail)
        focus = None
        if not result.converged and self._focusable((epsilon, epsilon), tail):
            focus = (epsilon, epsilon)  # grids cut above epsilon, cells focused on it
            result = self._delta_pass(epsilon, rtol, tilts, tail, focus, start=result.best)
        if round_off_matters(list(result.sides.values()), max(result.lower, 1e-300), rtol, epsilon, epsilon) or (
                not result.converged and tail > tail_budget(result.lower)):
            # the round-off or the tails are not small against delta: tilt the FFTs
            # towards epsilon, with tails cut in proportion to delta
            tail = min(1e-15, tail_budget(result.lower if result.lower > 0.0 else 1e-300))
            tilts = {(k, s): self._tilt(k, epsilon, tail, s) for k in self._directions() for s in (True, False)}
            result = self._delta_pass(epsilon, rtol, tilts, tail, focus, start=result.best)
        lo, hi = result.lower, result.upper
        if hi == 0.0:  # some composed loss may exceed epsilon: delta > 0, below float64's range
            hi = math.ulp(0.0)  # the least positive float bounds it
        return reported_delta(lo, hi, epsilon, rtol, result.converged or hi <= math.ulp(0.0),
                              self._advice(result))

    def _advice(self, result: PassResult) -> str:
        """What narrows the bracket of ``result`` (:func:`fdp.pld.queries.widening_advice`), or
        why nothing does: a mechanism whose lower bound is an attack, not its guarantee."""
        notes = [m.bracket_note for m, _ in self._grouped() if m.bracket_note]
        if notes:
            return notes[0]
        return widening_advice(result.stopped_by, grid_spacing=self.grid_spacing,
                               max_refinements=self.max_refinements, grid_scale=self.grid_scale,
                               max_points=self.max_points)

    def _delta_pass(self, epsilon: float, rtol: float, tilts: dict, tail: float,
                    focus: tuple[float, float] | None = None, start: dict | None = None) -> PassResult:
        """One refinement loop of :meth:`get_delta_bounds` (:func:`fdp.pld.refinement.delta_pass`)."""
        def side(d: Direction, pessimistic: bool, level: int) -> DiscretePLD:
            return self._side(d, pessimistic, tail, level, tilts.get((d, pessimistic), 0.0), focus)

        return delta_pass(side, self._directions(), epsilon, rtol, self.max_refinements,
                          refine=self.grid_spacing is None, start=start)

    def composed_pld(self, direction: Direction | str = "remove", *, pessimistic: bool = True,
                     tail_mass: float = 1e-15) -> DiscretePLD:
        """The composed discrete PLD of one direction (upper or lower bound).

        ``tail_mass``: the probability mass the discretisation may cut from each
        mechanism's loss tails (charged on the safe side of the bound), in (0, 1).
        """
        tail_mass = check_real("tail_mass", tail_mass, low=0.0, high=1.0, low_inclusive=False,
                               high_inclusive=False)
        self._start_query(optimistic=not pessimistic)
        return self._side(Direction(direction), bool(pessimistic), tail_mass)

    def tradeoff(self):
        """The composed g = min{f, f^-1}** as a TradeoffCurve, a certified lower bound
        (:func:`fdp.tradeoff.epsilon_delta.composed_tradeoff`)."""
        from fdp.tradeoff.epsilon_delta import composed_tradeoff

        self._start_query(optimistic=False)
        return composed_tradeoff({d: self.composed_pld(d, pessimistic=True) for d in self._directions()})

    # ----------------------------------------------------------- persistence
    def to_json(self) -> str:
        """The composed mechanisms and settings as JSON (no pickles)."""
        return accountant_to_json(self, _SETTINGS)

    @classmethod
    def from_json(cls, text: str) -> "PLDAccountant":
        """The accountant of a :meth:`to_json` document; ValueError saying what is wrong where."""
        return accountant_from_json(cls, text, _SETTINGS)

    # ------------------------------------------------------------- internals
    def _start_query(self, optimistic: bool = True) -> None:
        """Refuse an empty accountant; on a cold Numba cache, let helpers compile the
        kernels this query needs after its first group (:mod:`fdp._kernels.prefetch`);
        ``optimistic``: whether it composes optimistic PLDs (the merging sweep)."""
        if not self._events:
            raise ValueError("the accountant is empty: call compose(mechanism, steps) first")
        groups = [g for m, _ in self._grouped() for g in m.kernel_groups]
        prefetch.start([*groups, "pmf", *(["merge"] if optimistic else [])])

    def _focus_keys(self, direction: Direction, focus: tuple[float, float] | None) -> tuple:
        """What of ``focus`` each mechanism's cells depend on (all None: nothing)."""
        return tuple(None if focus is None else m.focus_key(direction, focus) for m, _ in self._grouped())

    def _focusable(self, focus: tuple[float, float], tail_mass: float) -> bool:
        """Whether a pass focused on ``focus`` would differ: some step's grid reaches above
        its cap (:func:`fdp.pld.plan.query_cap`), or some mechanism refines its cells there."""
        if self.grid_spacing is not None:
            return False  # a fixed grid is the user's choice: one pass (and its tilted one)
        cap = query_cap(focus)
        for d in self._directions():
            if any(k is not None for k in self._focus_keys(d, focus)):
                return True
            if cap is not None and any((g.offset + g.n) * g.h > cap for g in self._plan(d, tail_mass).grids):
                return True
        return False

    def _parts(self, direction: Direction, pessimistic: bool, tail_mass: float, level: int,
               focus: tuple[float, float] | None = None) -> list:
        """(single-step discrete PLD, count) of each mechanism on the level's grid (not
        cached: the cells are, and a discretisation of them is cheap)."""
        plan = self._plan(direction, tail_mass, level, query_cap(focus))
        discretise = discretise_pessimistic if pessimistic else discretise_optimistic
        return [(discretise(self._cells(m, direction, grid, pessimistic, focus)), c)
                for (m, c), grid in zip(self._grouped(), plan.grids)]

    def _side(self, direction: Direction, pessimistic: bool, tail_mass: float, level: int = 0,
              tilt: float = 0.0, focus: tuple[float, float] | None = None) -> DiscretePLD:
        """Composed pessimistic or optimistic PLD of one direction; ``level`` halves h,
        ``tilt`` tilts the FFT (:func:`fdp.pld.compose.compose`), ``focus`` is passed to
        the mechanisms' cells (:meth:`fdp.mechanisms.base.Mechanism.loss_cells`)."""
        key = ("side", direction, pessimistic, tail_mass, level, tilt, query_cap(focus),
               self._focus_keys(direction, focus))
        if key not in self._cache:
            parts = self._parts(direction, pessimistic, tail_mass, level, focus)
            self._cache[key] = compose_for_query(parts, focus, query_cap(focus), pessimistic=pessimistic,
                                                 tail_mass=tail_mass, max_points=self.max_points, tilt=tilt)
        return self._cache[key]

    def _cells(self, mechanism: Mechanism, direction: Direction, grid: Grid, pessimistic: bool,
               focus: tuple[float, float] | None = None):
        """Loss cells, shared by both sides (and all foci) when the mechanism's cells are exact."""
        if mechanism.exact_cells:
            key = ("cells", mechanism, direction, grid)
            if key not in self._cache:
                self._cache[key] = mechanism.loss_cells(direction, grid, pessimistic=pessimistic)
            return self._cache[key]
        key = ("cells", mechanism, direction, grid, pessimistic,
               None if focus is None else mechanism.focus_key(direction, focus))
        if key not in self._cache:
            self._cache[key] = mechanism.loss_cells(direction, grid, pessimistic=pessimistic, focus=focus)
        return self._cache[key]

    def _support_top(self, tail_mass: float, levels: dict) -> float:
        """The largest composed loss, over both directions (:func:`fdp.pld.queries.support_top`),
        from the steps on a grid the query has used (its cells are cached): a pessimistic
        side's level in ``levels`` ({side: (value, level)}), else level 0."""
        return max(support_top(self._parts(d, True, tail_mass, levels.get((d, True), (0, 0))[1]))
                   for d in self._directions())

    def _moments(self, direction: Direction, tail_mass: float, cap: float | None = None) -> float:
        key = ("sd", direction, tail_mass, cap)
        if key not in self._cache:
            self._cache[key] = composed_sd(self._grouped(), direction, tail_mass, cap)
        return self._cache[key]

    def _plan(self, direction: Direction, tail_mass: float, level: int = 0, cap: float | None = None) -> GridPlan:
        sd = None if self.grid_spacing is not None else self._moments(direction, tail_mass, cap)
        return grid_plan(self._grouped(), direction, tail_mass, level, grid_spacing=self.grid_spacing,
                         grid_scale=self.grid_scale, max_points=self.max_points, sd=sd, cap=cap)
