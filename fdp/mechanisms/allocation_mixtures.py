"""The step mechanisms random allocation accepts, as finite mixtures of Gaussian terms.

A step of random allocation runs the Gaussian mechanism with sensitivity mu
(:class:`fdp.Gaussian`), or with a random released sensitivity mu Z
(:class:`fdp.JL`, :class:`fdp.RandomSensitivityGaussian`: one epoch then releases
Z_1 .. Z_t, iid and free of the data, beside the outputs). Given the Z's the epoch
is the Gaussian allocation pair with sensitivities mu Z_j, so its likelihood ratio
is again a mean of t iid terms, W_j = exp(mu Z_j Y_j - mu^2 Z_j^2 / 2).

A finite mixture of components (mu_i, w_i) stands in for the law of mu Z on each
side. **Upper bound**: the two-point (Edmundson-Madansky) components of
:mod:`fdp.mechanisms.random_sensitivity.convexity` dominate one step (the profile
of every Z-cell lies below its chord at every eps); by Blackwell's theorem a Markov
kernel maps the mixture's pair to the step's, and applied to every coordinate it
maps the mixture's allocation pair to the true one, so the mixture's epoch
dominates. **Lower bound**: the one-point (Jensen) components are dominated, the
same way round. Moving a component's weight to a larger mu (up to mu = inf, the
step that reveals the example) keeps an upper bound; to a smaller one (down to
mu = 0, no loss) keeps a lower bound: that is how the few components are capped
(:func:`step_components`) and how float rounding of the weights is absorbed.

The cells here are coarser than the JL accountant's (the cost of a lattice is
components x classes): ``CELL_WIDTH`` relative in Z between its 1e-30 quantiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from fdp.mechanisms.allocation_big import BIG_WIDTH
from fdp.mechanisms.allocation_lattice import MAX_LATTICE_POINTS, TAIL
from fdp.mechanisms.gaussian import Gaussian
from fdp.mechanisms.random_sensitivity.cells import components
from fdp.mechanisms.random_sensitivity.convexity import jensen_points, position_bounds, two_point_weights
from fdp.mechanisms.random_sensitivity.mechanism import RandomSensitivityBase

__all__ = ["CELL_WIDTH", "MU_CAP", "MixturePlan", "mixture_plan", "mixture_tail", "step_components",
           "truncated_variance"]

#: Relative width of the Z-cells of a continuous law.
CELL_WIDTH = 0.01
#: Components above this mu are taken as mu = inf (upper) or dropped to 0 (lower) before
#: any lattice is planned: a term's W then exceeds e^700 with P1-probability 1 - 1e-300.
MU_CAP = 40.0
#: Components x classes of one mixture lattice (~0.25 us each: ~5 s per side).
CLASS_BUDGET = 20_000_000
#: P1-mass of a term beyond the top class, charged at +inf on the upper side, above which
#: a mixture is refused (every epoch adds it to delta: 1e-9 x 1,000 epochs = 1e-6).
TAIL_LIMIT = 1e-9
#: Share of ``TAIL_LIMIT`` that two large terms in one epoch may take before the plan
#: coarsens the spacing (a higher top T0): a coarser spacing widens every epoch's bracket,
#: while what is charged at +inf only adds to delta (sigma 1, r 10, t 235, 10 epochs: a
#: tenth gave a 1.31 % wide epsilon bracket, 0.9 gives 0.18 %; benchmarks/RESULTS.md).
PAIRS_SHARE = 0.9
#: Lattice spacing as a fraction of the sd of one epoch's likelihood ratio S / t (one term
#: cut where its P1 tail is BULK_TAIL).
SPACING_PER_SD = 1 / 16
BULK_TAIL = 0.05
#: Mass of each tail of Z left out of the cells (to mu = inf above, into the first cell below).
_Q_END = 1e-30


def step_components(mechanism: Any, pessimistic: bool, mu_sat: float = MU_CAP,
                    mu_min: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(mu_i, w_i), sorted, summing to at most 1: the mixture standing in for one step.

    Components above ``mu_sat`` go to inf (upper) or 0 (lower), those in (0, ``mu_min``)
    to ``mu_min`` (upper) or 0 (lower); the weights' rounding is absorbed at inf or 0."""
    if isinstance(mechanism, Gaussian):
        mus, weights = np.array([mechanism.mu]), np.array([1.0])
    elif isinstance(mechanism, RandomSensitivityBase):
        mus, weights = _z_components(mechanism, pessimistic, min(mu_sat, MU_CAP))
    else:  # pragma: no cover - RandomAllocation validates first
        raise TypeError(f"no mixture for {mechanism!r}")
    mus = np.asarray(mus, dtype=np.float64).copy()
    weights = np.asarray(weights, dtype=np.float64).copy()
    high = mus > mu_sat
    low = (mus > 0) & (mus < mu_min)
    if pessimistic:
        mus[high], mus[low] = math.inf, mu_min
    else:
        mus[high], mus[low] = 0.0, 0.0
    keep = weights > 0
    mus, weights = mus[keep], weights[keep]
    unique, index = np.unique(mus, return_inverse=True)
    merged = np.bincount(index, weights=weights, minlength=unique.size)
    return _normalised(unique, merged, pessimistic)


def _normalised(mus: np.ndarray, weights: np.ndarray, pessimistic: bool) -> tuple[np.ndarray, np.ndarray]:
    """Weights summing to <= 1 exactly (math.fsum), the rest at inf (upper) or 0 (lower)."""
    n = weights.size
    total = math.fsum(weights)
    if total > 1.0:
        weights = weights / total * (1.0 - 4 * n * 2.0**-53)
    rest = 1.0 - math.fsum(weights)
    rest = max(rest * (1.0 - 2.0**-50) - n * 2.0**-53, 0.0)
    if rest > 0.0:
        extra = math.inf if pessimistic else 0.0
        where = np.flatnonzero(mus == extra)
        if where.size:
            weights = weights.copy()
            weights[where[0]] += rest
        else:
            mus, weights = np.append(mus, extra), np.append(weights, rest)
            order = np.argsort(mus)
            mus, weights = mus[order], weights[order]
    while math.fsum(weights) > 1.0:  # a last rounding: shave the largest weight
        weights[np.argmax(weights)] *= 1.0 - 2.0**-52
    return mus, weights


def _z_components(mechanism: RandomSensitivityBase, pessimistic: bool, mu_sat: float) -> tuple[np.ndarray, np.ndarray]:
    law, sigma = mechanism.law(), mechanism.noise_multiplier
    if law.atoms() is not None:  # a discrete law is its own mixture
        return components(law, sigma, 1.0, sigma * mu_sat, pessimistic)
    z_bot = float(law.ppf(_Q_END))
    if not z_bot > law.lower:
        z_bot = law.lower
    z_top = min(sigma * mu_sat, float(law.isf(_Q_END)), law.upper)
    z_bot = max(z_bot, 1e-300)
    if not z_top > z_bot:
        z_top = z_bot * (1 + 1e-12) + 1e-300
    count = max(1, int(math.ceil(math.log(z_top / z_bot) / math.log1p(CELL_WIDTH))))
    edges = np.concatenate([[law.lower], np.geomspace(z_bot, z_top, count + 1), [law.upper]])
    edges = np.unique(edges)
    weights = law.mass(edges[:-1], edges[1:])
    weights[0] = law.mass(np.array(-math.inf), np.array(edges[1]))  # the bottom cell is closed
    k = int(np.sum(np.isfinite(edges[1:])))
    under, over = position_bounds(law, edges[:k], edges[1:k + 1], sigma, closed_first=True)
    if pessimistic:
        return edges / sigma, two_point_weights(edges, weights, over)
    z_bar = np.concatenate([jensen_points(edges[:k], edges[1:k + 1], under, sigma), edges[k:-1]])
    return z_bar / sigma, weights


def mixture_tail(mus: np.ndarray, weights: np.ndarray, log_w: float) -> float:
    """sum_i w_i P1_i(W >= e^log_w) over the finite mu_i > 0 (under P1, log W ~ N(mu^2/2, mu^2))."""
    finite = np.isfinite(mus) & (mus > 0)
    m = mus[finite]
    return float(np.sum(weights[finite] * special.ndtr(-(log_w - 0.5 * m * m) / m)))


def mixture_q_tail(mus: np.ndarray, weights: np.ndarray, log_w: float) -> float:
    """An upper bound on Q(W >= e^log_w), log_w > 0 (mu = inf and 0 have no W above 1)."""
    finite = np.isfinite(mus) & (mus > 0)
    m = mus[finite]
    return float(np.sum(weights[finite] * special.ndtr(-(log_w + 0.5 * m * m) / m))) * (1 + 1e-12) + 1e-300


def truncated_variance(mus: np.ndarray, weights: np.ndarray, log_w: float) -> float:
    """Var_Q of one term W truncated to W < e^log_w (mu = inf counts as W = 0, mu = 0 as W = 1)."""
    finite = np.isfinite(mus) & (mus > 0)
    m, w = mus[finite], weights[finite]
    y = (log_w + 0.5 * m * m) / m
    second = np.exp(np.minimum(m * m + special.log_ndtr(y - 2 * m), 2 * log_w))  # E[W^2 ; W < T] <= T^2
    first = special.ndtr(y - m)
    zero = float(np.sum(weights[mus == 0]))
    mean = float(np.sum(w * first)) + zero
    return max(float(np.sum(w * second)) + zero - mean * mean, 0.0)


@dataclass(frozen=True)
class MixturePlan:
    """A mixture lattice: class ``spacing`` and count, components capped at ``mu_sat``
    (a term's P1-mass below the top is then <= 1e-12) and floored at ``mu_min`` (a class
    near W = 1 is then at most ~1/W wide in Y, where the quadrature's bound still holds
    it: below, a component's one class would be too wide to bound), and the P1 ``tail``
    beyond the top."""

    spacing: float
    classes: int
    mu_sat: float
    mu_min: float
    tail: float
    log_edges: np.ndarray | None = None  # the large term's classes (allocation_big), if any


@functools.lru_cache(maxsize=16)
def mixture_plan(mechanism: Any, steps: int) -> MixturePlan:
    """The lattice of a mixture: spacing ``SPACING_PER_SD`` of the sd of S / t with W cut
    at the bulk (where the P1 tail is ``BULK_TAIL``: a heavy component's tail would
    otherwise coarsen the spacing where the answer is decided), classes up to where
    the P1 tail is ``TAIL``, or, past ``CLASS_BUDGET`` (components x classes), up to a top
    T0 with the large term on log classes above it up to that point
    (:mod:`fdp.mechanisms.allocation_big`); two terms at or above T0 are charged,
    P1(W >= T0) (t-1) Q(W >= T0) + C(t-1, 2) Q(W >= T0)^2, and while that exceeds
    ``PAIRS_SHARE`` of ``TAIL_LIMIT`` the spacing doubles (a higher T0). Refused if what is charged at
    +inf per epoch exceeds ``TAIL_LIMIT``."""
    mus, weights = step_components(mechanism, True)
    log_max = _tail_quantile(mus, weights, TAIL)
    spacing = math.sqrt(truncated_variance(mus, weights, _tail_quantile(mus, weights, BULK_TAIL)) / steps)
    spacing = max(spacing * SPACING_PER_SD, 1e-12)
    live = int(np.sum((mus > 0) & (mus <= _saturation(log_max))))
    budget = min(CLASS_BUDGET // max(live, 1), MAX_LATTICE_POINTS // 4)
    log_edges, pairs = None, 0.0
    classes = int(math.ceil(math.exp(log_max) / spacing)) + 1
    if classes > budget:
        if steps == 1:
            raise ValueError(_too_heavy(mechanism, steps, mixture_tail(mus, weights, math.log(budget * spacing))))
        for _ in range(60):
            classes = budget
            log_t0 = math.log(classes * spacing)
            pairs = _two_large(mus, weights, log_t0, steps)
            if pairs <= PAIRS_SHARE * TAIL_LIMIT or log_t0 >= log_max:
                break
            spacing *= 2
        count = max(1, int(math.ceil((log_max - log_t0) / BIG_WIDTH)))
        log_edges = log_t0 + np.arange(count + 1) * BIG_WIDTH
    log_top = float(log_edges[-1]) if log_edges is not None else math.log(classes * spacing)
    mu_sat = _saturation(log_top)
    tail = mixture_tail(mus, weights, log_top) + float(np.sum(weights[mus > mu_sat])) + pairs
    # the FFT window: the small classes' sum, spread ~16 sd of its t terms (each cut at T0)
    log_t0 = math.log(classes * spacing)
    points = classes + 16 * math.sqrt(truncated_variance(mus, weights, log_t0) * steps) / spacing + steps
    if points > MAX_LATTICE_POINTS:
        raise ValueError(f"random-allocation accounting of {mechanism!r} with steps_per_epoch={steps} needs "
                         f"a lattice of ~{points:.3g} points, more than {MAX_LATTICE_POINTS}: fewer steps per "
                         "epoch (a larger batch) or Poisson sampling")
    if tail > TAIL_LIMIT:
        raise ValueError(_too_heavy(mechanism, steps, tail))
    return MixturePlan(spacing=spacing, classes=classes, mu_sat=mu_sat, mu_min=spacing, tail=tail,
                       log_edges=log_edges)


def _two_large(mus: np.ndarray, weights: np.ndarray, log_t0: float, steps: int) -> float:
    """A bound on the P-mass of two or more terms at or above T0 = e^log_t0: the
    example's term and another, or two others (the singular mu = inf part counts as large)."""
    q_big = mixture_q_tail(mus, weights, log_t0)
    p_big = mixture_tail(mus, weights, log_t0) + float(np.sum(weights[~np.isfinite(mus)]))
    return p_big * (steps - 1) * q_big + 0.5 * (steps - 1) * (steps - 2) * q_big * q_big


def _tail_quantile(mus: np.ndarray, weights: np.ndarray, tail: float) -> float:
    lo, hi = -5.0, 700.0
    if mixture_tail(mus, weights, hi) > tail:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mixture_tail(mus, weights, mid) > tail else (lo, mid)
    return hi


def _saturation(log_top: float) -> float:
    """mu above which P1(W < e^log_top) <= Phi(-7) ~ 1e-12: (mu^2/2 - log_top) / mu >= 7."""
    return 7.0 + math.sqrt(49.0 + 2.0 * max(log_top, 0.0))


def _too_heavy(mechanism: Any, steps: int, tail: float) -> str:
    more = "" if isinstance(mechanism, Gaussian) else " or more jl_projections"
    return (f"{mechanism!r} is too heavy-tailed for random-allocation accounting with steps_per_epoch={steps}: "
            f"a lattice within budget leaves P1-mass {tail:.3g} per epoch beyond its classes (above its top, "
            f"or two large terms in one epoch; the limit is {TAIL_LIMIT:g}). Use a larger noise_multiplier{more}, "
            "or account Poisson sampling instead")
