"""A mechanism known only through its privacy profile delta(eps).

Setting. The user gives eps -> delta(eps), eps >= 0, non-increasing, for ONE
unsubsampled step of a mechanism that is (eps, delta(eps))-DP for every eps >= 0
and for both orderings of neighbours (symmetric).

Semantics. ``FromDelta(delta)`` is the least private mechanism with that
guarantee: the symmetric pair whose tradeoff curve is

    f(alpha) = sup_{eps >= 0} max(0, 1 - delta(eps) - e^eps alpha, e^-eps (1 - delta(eps) - alpha)),

fact (a) below. When delta is the exact profile of a symmetric pair (then it is
convex in x = e^eps) this is that pair's curve, and the mechanism's profile is
delta itself. When it is not (a jump, a concave stretch), the mechanism's
profile is the convex minorant of delta in x, below delta, and the bracket is
on that mechanism's epsilon. With subsampling we need an actual pair of
output laws (P0, P1) (the mixture (1-p) P0 + p P1 is not determined by delta
alone), so we build two *discrete pairs* from delta on a grid
0 = eps_0 < eps_1 < ... < eps_m and account with those.

Facts used (Dong-Roth-Su, arXiv:1905.02383v3, "DRS"):

(a) Prop. 2.12: being (eps, delta(eps))-DP for all eps is the same as being
    f-DP with f(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha); with
    symmetry the lines e^-eps (1 - delta(eps) - alpha) join the supremum
    (they are the lines of the negative eps, where the profile of a symmetric
    pair is delta(-eps) = 1 - e^-eps + e^-eps delta(eps)).
(b) Thm 2.10 (Blackwell): T(A0||A1) <= T(B0||B1) iff (B0, B1) is a
    post-processing (one Markov kernel for both) of (A0, A1). A kernel that maps
    A0 -> B0 and A1 -> B1 maps (1-p) A0 + p A1 -> (1-p) B0 + p B1, so the
    subsampled pairs of both neighbouring relations, and their compositions,
    inherit the order: a pair with a *smaller* curve gives a *larger* delta
    for every eps, direction, sampling rate and number of steps.
(c) A convex polygon f with vertices (alpha_k, beta_k) is T(P0||P1) of the
    discrete pair whose outcome k has P0-mass alpha_k - alpha_{k-1} and
    P1-mass beta_{k-1} - beta_k (Neyman-Pearson: rejecting outcomes in the
    order of decreasing likelihood ratio traces the segments), plus an outcome
    with P1-mass 1 - f(0) and no P0-mass. For a symmetric polygon we take the
    left half (alpha up to the fixed point alpha* = f(alpha*)) and mirror it:
    outcome (P0, P1) = (d0, d1) gets a twin (d1, d0). Then the masses are
    differences of small numbers (no cancellation) and the pair is exactly
    symmetric, with total mass (1 - f(0)) + (f(0) - alpha*) + alpha* = 1.

Pessimistic pair (an upper bound on every delta). f_grid is the envelope (a)
over the grid points only, ``fdp.epsilon_delta_curve(eps_i, delta(eps_i))``.
It is a supremum over fewer lines, so f_grid <= f, and by (b) the pair of (c)
for f_grid dominates the mechanism: every delta it reports is >= the truth,
with or without subsampling, in both directions, after composition. Its
losses are exactly +-eps_i; its profile equals delta at the grid points and,
between them, is the chord in e^eps ("connect the dots", Doroshenko et al.
2022, arXiv:2207.04380v1, Sec. 4). Mass beyond eps_m is the +inf atom,
1 - f_grid(0) = delta(eps_m). This needs nothing of delta but that it is a
valid bound: if the callable is only an upper bound on the mechanism's
profile, the pessimistic side is still sound.

Optimistic pair, convex samples (the grid values are convex in x, up to
rounding: ``convexity_excess`` <= 1e-12; the bound then assumes delta is convex
between grid points too, as an exact profile E_Q[(dP/dQ - x)_+] is). A chord of
neighbouring grid points, extended outside its interval, lies below a convex
function. On [x_i, x_{i+1}] therefore

    delta(x) >= low(x) = max(l_{i-1}(x), l_{i+1}(x), 0),                        (1)

l_j the secant line through (x_j, delta_j), (x_{j+1}, delta_{j+1}), with
l_{-1} from the symmetric extension delta(-eps_1) = 1 - e^-eps_1 (1 - delta_1)
and, above x_m, low(x) = max(l_{m-1}(x), 0). low is piecewise linear; its kinks
are the pairwise crossings of the three lines in (1). Let V be the grid points
and the kinks, with the values of low there. Then

    f_opt(alpha) = max over v in V of the lines of (a) with delta = low(v)
                 >= sup over all x of the lines of (a) with delta = low(x)   (2)
                 >= f(alpha),

because 1 - low(x) - x alpha and (1 - low(x) - alpha)/x are maximised over x
at a vertex of the convex minorant of low (on each of its linear pieces the
first is linear and the second monotone in x), every such vertex is in V,
and low <= delta. So f_opt >= f and by (b) the pair of (c) for f_opt is
dominated by the mechanism: its deltas are <= the truth. Samples above the
chord by a relative excess tau <= 1e-12 (rounding) move an extended secant by
at most (1 + 2r) tau, r the largest ratio of neighbouring x-intervals, and low
is lowered by that factor.

Optimistic pair, samples not convex (a ``NonConvexProfileWarning``): only
monotonicity is used. On (eps_i, eps_{i+1}] delta >= delta_{i+1}, beyond eps_m
delta >= 0, and lines (a) of a smaller delta at a smaller eps are higher, so
the polygon of the points (eps_i, delta_{i+1}) and (eps_m, 0)
(``step_lower_profile``) is >= f: a first-order bound in the grid spacing.
If the callable is only an upper bound on some mechanism's profile, the
optimistic side bounds the least private mechanism that bound allows.

Error. The pessimistic profile is exact at the grid points, the optimistic
one is below by O(h^2) there too; between grid points both differ from the
truth by O(h^2) (h the eps spacing, in units of the curvature of delta in
e^eps). The composed gap grows with the number of steps, so pass a finer
grid (``num_points`` or ``epsilons``) for long compositions. When delta is
piecewise linear in e^eps with its kinks on the grid (randomized response
with eps0 in the grid) both pairs reproduce the mechanism exactly.

Input noise. A profile may rise by up to 1e-9 between grid points (rounding in
the user's formula); it is then made monotone upwards (running maximum from
the right) for the pessimistic pair and downwards (running minimum from the
left) for the optimistic one, which keeps each on its safe side.

Notation: x = e^eps, delta_i = delta(eps_i), alpha/beta type I/II errors of
testing P0 against P1, f = T(P0||P1), p the sampling rate.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdp._validation import check_array, check_integer, check_sampling_rate
from fdp.mechanisms._atoms import largest_atom, pair_cells, pair_loss_range
from fdp.mechanisms.base import Mechanism, register_mechanism
from fdp.mechanisms.profile_pairs import (
    CONVEX_RTOL,
    MAX_EPSILON,
    convexity_excess,
    lower_profile,
    step_lower_profile,
    symmetric_pair_from_curve,
)
from fdp.pld.cells import Direction, Grid, LossCells
from fdp.tradeoff.base import TradeoffCurve

__all__ = ["FromDelta", "NonConvexProfileWarning"]

#: delta below this at the top of the default grid ends the grid there.
_TAIL_DELTA = 1e-20
#: A profile may increase by this much (rounding noise) before it is refused.
_MONOTONE_TOL = 1e-9
#: An excess over the chord within a few units in the last place of the samples is
#: their own rounding (a profile linear in e^eps computes so): taken as convex as given.
_ULP_EXCESS = 8 * 2.0**-52


class NonConvexProfileWarning(UserWarning):
    """The profile is not convex in e^eps, so it is not the exact profile of any mechanism."""


def _evaluate_profile(fn: Callable[[Any], Any], eps: np.ndarray) -> np.ndarray:
    """fn on a grid, vectorised if fn accepts arrays, elementwise otherwise; validated."""
    try:
        out = np.broadcast_to(np.asarray(fn(eps), dtype=np.float64), eps.shape).copy()
    except (TypeError, ValueError):
        out = np.array([float(fn(float(e))) for e in eps], dtype=np.float64)
    bad = ~np.isfinite(out) | (out < 0.0) | (out > 1.0)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"delta_of_epsilon must return probabilities in [0, 1]; got delta({eps[i]!r}) = {out[i]!r}"
        )
    rise = np.diff(out)
    if np.any(rise > _MONOTONE_TOL):
        i = int(np.argmax(rise))
        raise ValueError(
            "delta_of_epsilon must be non-increasing in epsilon; got "
            f"delta({eps[i]!r}) = {out[i]!r} < delta({eps[i + 1]!r}) = {out[i + 1]!r}"
        )
    return out


def _default_grid(fn: Callable[[Any], Any], num_points: int) -> np.ndarray:
    """num_points uniform on [0, eps_max], eps_max the first of 1/8, 1/4, ..., 512 with delta <= 1e-20."""
    probe = 2.0 ** np.arange(-3, 10)
    small = _evaluate_profile(fn, probe) <= _TAIL_DELTA
    eps_max = float(probe[int(np.argmax(small))]) if np.any(small) else float(probe[-1])
    return np.linspace(0.0, eps_max, num_points)


@dataclass(frozen=True)
class _Pairs:
    """Precomputed discrete pairs and the pessimistic curve of a FromDelta."""

    pess: tuple[np.ndarray, np.ndarray]
    opt: tuple[np.ndarray, np.ndarray]
    curve: Any


@register_mechanism
@dataclass(frozen=True)
class FromDelta(Mechanism):
    """A mechanism given by its privacy profile eps -> delta(eps) (one unsubsampled step).

    ``delta_of_epsilon`` is the delta of the mechanism *without* subsampling,
    for eps >= 0, valid for both orderings of neighbours (symmetric). The
    accountant uses two discrete pairs built from it on an eps grid (see the
    module docstring for the construction and the proof):

    * pessimistic: the pair of the polygon epsilon_delta_curve(eps_i, delta(eps_i)),
      a valid upper bound whenever delta_of_epsilon is a valid bound;
    * optimistic: the pair of a polygon above the true curve, built from the
      secant lower bound (1); a lower bound when delta_of_epsilon is the
      *exact* profile (convex in e^eps).

    Subsampling (sampling_rate < 1) mixes these pairs, P = (1-p) P0 + p P1,
    which is sound for both directions by Blackwell's theorem (fact (b)).

    Args:
      delta_of_epsilon: callable eps -> delta in [0, 1], non-increasing; it
        should accept a NumPy array (scalar-only callables are applied
        elementwise).
      sampling_rate: Poisson sampling rate p in (0, 1].
      epsilons: optional grid (eps >= 0, at most 500; 0 is added). Default:
        ``num_points`` uniform points on [0, eps_max], eps_max the first of
        1/8, 1/4, ..., 512 where delta <= 1e-20.
      num_points: size of the default grid (3 .. 2**20).

    Raises:
      TypeError: delta_of_epsilon is not callable.
      ValueError: bad sampling_rate, epsilons or num_points, or
        delta_of_epsilon returns NaN, values outside [0, 1], or increases.

    Examples:
      >>> import fdp, numpy as np
      >>> rr = lambda e: np.maximum(0.0, (np.e - np.exp(e)) / (1 + np.e))  # RR, eps0 = 1
      >>> fdp.PLDAccountant().compose(fdp.FromDelta(rr), 10).get_epsilon_bounds(1e-6)
    """

    delta_of_epsilon: Callable[[Any], Any]
    sampling_rate: float = 1.0
    epsilons: tuple[float, ...] | None = None
    num_points: int = 4097
    _pairs: _Pairs | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    kind = "from_delta"

    def __post_init__(self) -> None:
        if not callable(self.delta_of_epsilon) or isinstance(self.delta_of_epsilon, TradeoffCurve):
            # a curve is callable too (alpha -> beta): it failed with "alpha must be ... in [0, 1]; got 2.0"
            hint = ": pass its privacy profile, curve.delta" if callable(self.delta_of_epsilon) else ""
            raise TypeError(
                f"delta_of_epsilon must be callable (eps -> delta); got {type(self.delta_of_epsilon).__name__}{hint}"
            )
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))
        n = check_integer("num_points", self.num_points, low=3, high=1 << 20)
        object.__setattr__(self, "num_points", n)
        if self.epsilons is None:
            grid = _default_grid(self.delta_of_epsilon, n)
        else:
            given = check_array("epsilons", self.epsilons, low=0.0, high=MAX_EPSILON, ndim=1)
            grid = np.unique(np.concatenate([[0.0], given]))
            if grid.size < 2:
                raise ValueError(f"epsilons must contain a value > 0; got {self.epsilons!r}")
            object.__setattr__(self, "epsilons", tuple(float(e) for e in given))
        object.__setattr__(self, "_pairs", self._build(grid))

    def _build(self, grid: np.ndarray) -> _Pairs:
        from fdp.tradeoff import epsilon_delta_curve

        dlt = _evaluate_profile(self.delta_of_epsilon, grid)
        # rounding noise within _MONOTONE_TOL: round up (pessimistic) or down (optimistic)
        d_up = np.maximum.accumulate(dlt[::-1])[::-1]
        d_down = np.minimum.accumulate(dlt)
        pess_curve = epsilon_delta_curve(grid, d_up)
        excess, bad = convexity_excess(grid, d_down)
        if excess <= CONVEX_RTOL:
            eps_v, low_v = lower_profile(grid, d_down)
            if excess > _ULP_EXCESS:  # rounding: a sample above the chord by excess (relative)
                # moves an extended secant by at most (1 + 2 r) excess, r the largest
                # ratio of neighbouring intervals in x; lower the bound by that
                x = np.exp(grid)
                gaps = np.diff(x)
                r = float(np.max(np.maximum(gaps[1:] / gaps[:-1], gaps[:-1] / gaps[1:]), initial=1.0))
                low_v = low_v * (1.0 - (1.0 + 2.0 * r) * excess)
        else:
            warnings.warn(
                f"delta_of_epsilon is not convex in e^eps (near eps = {grid[max(bad - 1, 0)]:.6g}), so "
                "it is not the exact profile of any mechanism; accounting for the least private "
                "mechanism it allows, f(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha), "
                "with a lower bound first-order in the grid spacing (pass a finer epsilons grid "
                "for a narrower bracket)",
                NonConvexProfileWarning,
                stacklevel=4,
            )
            eps_v, low_v = step_lower_profile(grid, d_down)
        opt_curve = epsilon_delta_curve(eps_v, low_v)
        return _Pairs(
            pess=symmetric_pair_from_curve(pess_curve),
            opt=symmetric_pair_from_curve(opt_curve, merge_rounding=True),
            curve=pess_curve,
        )

    def _log_pair(self, pessimistic: bool) -> tuple[np.ndarray, np.ndarray]:
        assert self._pairs is not None
        return self._pairs.pess if pessimistic else self._pairs.opt

    def is_symmetric(self) -> bool:
        """Both pairs are exactly symmetric by construction."""
        return True

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        lp0, lp1 = self._log_pair(pessimistic)
        return pair_cells(lp0, lp1, self.sampling_rate, Direction(direction), grid)

    def grid_anchor(self, direction: Direction) -> float | None:
        """The pessimistic pair's largest atom (see :meth:`Mechanism.grid_anchor`)."""
        return largest_atom(*self._log_pair(True), self.sampling_rate, Direction(direction))

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        """Union of the ranges of the pessimistic and the optimistic pair."""
        ranges = [
            pair_loss_range(*self._log_pair(pess), self.sampling_rate, Direction(direction), tail_mass)
            for pess in (True, False)
        ]
        return min(r[0] for r in ranges), max(r[1] for r in ranges)

    def tradeoff(self):
        """The pessimistic polygon epsilon_delta_curve(eps_i, delta(eps_i)) (<= the true curve)."""
        assert self._pairs is not None
        return self._pairs.curve

    def to_dict(self) -> dict[str, Any]:
        raise ValueError(
            "FromDelta cannot be serialised: delta_of_epsilon is a Python callable, and callables "
            "cannot be written to JSON. Rebuild the accountant in code, or tabulate the mechanism "
            "(e.g. fdp.FromDistributions) to serialise it"
        )
