"""Query policy of the accountant: which delta it certifies, its tail budget, when
the FFT round-off calls for a tilted pass, and the warning for a wide bracket."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Iterator

import numpy as np

from fdp._validation import check_delta
from fdp.pld.compose import steps_loss_error
from fdp.pld.pmf import DiscretePLD
from fdp.pld.roundoff import U

__all__ = [
    "EPSILON_ATOL",
    "MIN_DELTA",
    "check_certifiable_delta",
    "gap_unwarned",
    "reported",
    "reported_delta",
    "round_off_epsilon_shift",
    "round_off_matters",
    "round_off_moves_epsilon",
    "support_top",
    "tail_budget",
    "widening_advice",
]

#: Smallest delta certified (the tail budget 1e-4 * delta must stay a normal float64).
MIN_DELTA = 1e-290
#: Bracket width on epsilon below which no width warning is given, whatever its
#: relative size (a mechanism that spends nothing has bounds [0, ~1e-24]).
EPSILON_ATOL = 1e-12


def round_off_epsilon_shift(pld: DiscretePLD, delta: float) -> float:
    """How far this side's round-off charge moves its epsilon at ``delta``: all that a
    perfectly tilted pass could win back on it (0 for an exact side)."""
    if pld.bound == 0:
        return 0.0
    if pld.tilt == 0.0:
        if pld.round_off == 0.0:
            return 0.0
        clean = (dataclasses.replace(pld, p_inf=max(pld.p_inf - pld.round_off, 0.0)) if pld.bound > 0
                 else dataclasses.replace(pld, delta_shift=pld.delta_shift + pld.round_off))
    else:
        if pld.log_charge == -math.inf:
            return 0.0
        clean = dataclasses.replace(pld, log_charge=-math.inf)
    charged, uncharged = pld.epsilon(delta), clean.epsilon(delta)
    if charged == uncharged:
        return 0.0
    return abs(charged - uncharged)


def round_off_moves_epsilon(pld: DiscretePLD, delta: float, rtol: float, hi: float) -> bool:
    """True when the side's round-off moves its epsilon by more than a twentieth of the
    tolerance rtol * hi (so a tilted pass, :func:`fdp.pld.compose.compose`, would
    tighten the bracket noticeably); below that a tilted pass costs time for nothing.

    The shift is exact for the side (its eps with and without the charge), and a bracket
    is set by two sides (one pessimistic, one optimistic): kept below rtol * hi / 20 each,
    the round-off's part of the bracket is at most rtol * hi / 10, whatever the split."""
    limit = 0.05 * rtol * hi if math.isfinite(hi) else 0.0
    return round_off_epsilon_shift(pld, delta) > limit


def round_off_matters(sides: list[DiscretePLD], delta: float, rtol: float, lo: float, hi: float) -> bool:
    """True when some side's FFT round-off charge at the eps found is not small against
    delta (so a tilted pass, :func:`fdp.pld.compose.compose`, would tighten it)."""
    limit = 1e-3 * rtol * delta
    for pld in sides:
        if pld.tilt == 0.0:
            if pld.round_off > limit:
                return True
        elif float(pld.charge(np.array([hi if pld.bound > 0 else lo]))[0]) > limit:
            return True
    return False


def support_top(parts: list) -> float:
    """A certified top of the composed loss of ``parts`` ((pessimistic single-step PLD,
    count) pairs): the composition has no loss above it, so delta(eps) = 0 for eps >= it
    and eps(delta) <= it for every delta > 0 (the pure-DP bound). inf when some step has
    an atom at +inf. A pessimistic step's top grid loss is at or above its binned largest
    loss (mass is only ever moved up), which is within ``loss_error`` of the true one; the
    computed grid losses and their sum are within (4 + 2 n) u of the exact ones; both
    are charged upwards."""
    top, size = 0.0, 0.0
    for pld, count in parts:
        if pld.p_inf > 0.0:
            return math.inf
        support = np.flatnonzero(pld.pmf > 0.0)
        if support.size:
            term = count * ((pld.offset + int(support[-1])) * pld.h)
            top, size = top + term, size + abs(term)
    # the binned losses' own errors (LossCells.loss_error), then the sum's
    return top + steps_loss_error(parts) + (4 + 2 * len(parts)) * U * size + 1e-300


def check_certifiable_delta(delta: float) -> float:
    """delta in [MIN_DELTA, 1): below, the tail budget 1e-4 delta is not a float64 number."""
    delta = check_delta(delta)
    if delta < MIN_DELTA:
        raise ValueError(
            f"delta={delta:.3g} is below {MIN_DELTA:g}, the smallest delta the accountant certifies: "
            f"it leaves 1e-4 * delta of tail mass outside its grids, and float64 numbers end near "
            f"1e-308; ask for delta >= {MIN_DELTA:g}"
        )
    return delta


def tail_budget(delta: float) -> float:
    """Mass each FFT tail may hold: 1e-4 of delta (it moves epsilon by ~1e-4 / |d log delta / d eps|)."""
    return max(1e-4 * delta, 1e-300)


def widening_advice(stopped_by: str | None, *, grid_spacing: float | None, max_refinements: int,
                    grid_scale: float, max_points: int) -> str:
    """What narrows a bracket that a pass left wider than its tolerance, by why the pass
    stopped (:attr:`fdp.pld.refinement.PassResult.stopped_by`): the setting and its value."""
    if stopped_by == "fixed" and grid_spacing is not None:
        return (f"narrow it with a smaller grid_spacing of fdp.PLDAccountant (grid_spacing={grid_spacing / 4:.3g}), "
                f"or grid_spacing=None: the automatic grid, refined as needed")
    if stopped_by == "refinements" and max_refinements < 8:
        return f"narrow it with fdp.PLDAccountant(max_refinements={min(8, max_refinements + 3)})"
    if stopped_by == "refinements":
        return f"narrow it with fdp.PLDAccountant(grid_scale={grid_scale / 4:.3g})"
    if stopped_by == "points" and max_points < 1 << 27:
        return f"narrow it with fdp.PLDAccountant(max_points={min(1 << 27, 4 * max_points)})"
    return (f"try a finer grid, fdp.PLDAccountant(grid_scale={grid_scale / 16:.3g}): halving it stopped "
            f"narrowing the bracket, so what is left may be the mechanisms' own discretisation (their "
            f"cells) or the float round-off, which no setting removes")


_PASS_IT_ON = ", passed as accountant= to fdp_tf.PrivacyCallback, fdp.dpsgd or fdp.calibrate_noise_multiplier"


@contextlib.contextmanager
def gap_unwarned() -> Iterator[None]:
    """No warning for a bracket that is wide by nature (a mechanism's ``bracket_note``: its
    lower bound is an attack), where only the upper bound is wanted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*accept the gap", category=UserWarning)
        yield


def reported(lo: float, hi: float, delta: float, rtol: float, advice: str) -> tuple[float, float]:
    """(lo, hi) of an epsilon query, with a warning when the bounds are not as tight as
    asked (hi - lo > rtol * hi); ``advice`` (:func:`widening_advice`) says what narrows them."""
    if hi == math.inf:
        warnings.warn(
            f"the certified upper bound on epsilon at delta={delta:.3g} is inf: the composed "
            f"privacy loss is +inf (or beyond the grid) with probability >= delta. Heavy-tailed "
            f"mechanisms (e.g. fdp.JL with few jl_projections) do this; lower bound: {lo:.6g}",
            stacklevel=3,
        )
    elif hi - lo > rtol * hi and hi - lo > EPSILON_ATOL:
        warnings.warn(
            f"epsilon bounds [{lo:.6g}, {hi:.6g}] are wider than the relative tolerance {rtol:g}; "
            f"report the upper one, or {advice}" + (_PASS_IT_ON if advice.startswith(("narrow", "try")) else ""),
            stacklevel=3,
        )
    return lo, hi


def reported_delta(lo: float, hi: float, epsilon: float, rtol: float, converged: bool,
                   advice: str) -> tuple[float, float]:
    """(lo, hi) of a delta query, with a warning when the bracket is wider than its
    tolerance (``converged``: :func:`fdp.pld.refinement.delta_within_tolerance`)."""
    if not converged:
        warnings.warn(
            f"delta bounds [{lo:.6g}, {hi:.6g}] at epsilon={epsilon:.6g} are wider than the tolerance "
            + (f"(more than {rtol:g} relative, and the upper curve reaches delta={lo:.3g} only beyond "
               f"epsilon + {rtol:g} * max(epsilon, 1)); " if lo > 0.0 else "(the lower bound is 0); ")
            + f"report the upper one, or {advice}" + (_PASS_IT_ON if advice.startswith(("narrow", "try")) else ""),
            stacklevel=3,
        )
    return lo, hi
