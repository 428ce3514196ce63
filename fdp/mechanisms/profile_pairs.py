"""Discrete pairs from a privacy profile: the polygons of :mod:`fdp.mechanisms.from_delta`.

Each function is one step of the construction proven in that module's docstring:
the convexity test of the samples, the secant lower bound (1) of a convex profile,
the step lower bound of a merely non-increasing one, and the symmetric discrete
pair of a symmetric polygon (fact (c)).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "CONVEX_RTOL",
    "MAX_EPSILON",
    "convexity_excess",
    "first_nonconvex_point",
    "lower_profile",
    "step_lower_profile",
    "symmetric_pair_from_curve",
]

#: Largest grid epsilon (e^eps must stay far from float overflow).
MAX_EPSILON = 500.0
#: A profile above the chord of its neighbours (in e^eps) by at most this relative
#: amount counts as convex (rounding in the user's formula); the secant lower
#: bound is then lowered to stay below it.
CONVEX_RTOL = 1e-12


def convexity_excess(eps: np.ndarray, dlt: np.ndarray) -> tuple[float, int]:
    """(max_j e_j, argmax) with e_j how far delta_j is above the chord of its neighbours in
    x = e^eps, relative to the largest of the three (the symmetric extension
    delta(-eps_1) = 1 - e^-eps_1 (1 - delta_1) included). <= 0 for samples convex in x,
    as those of the exact profile of any symmetric pair are."""
    x = np.concatenate([[math.exp(-eps[1])], np.exp(eps)])
    d = np.concatenate([[1.0 - math.exp(-eps[1]) * (1.0 - dlt[1])], dlt])
    lam = (x[2:] - x[1:-1]) / (x[2:] - x[:-2])
    chord = lam * d[:-2] + (1.0 - lam) * d[2:]
    scale = np.maximum(np.maximum(d[:-2], d[1:-1]), d[2:])
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(scale > 0.0, (d[1:-1] - chord) / scale, 0.0)
    j = int(np.argmax(excess))
    return float(excess[j]), j


def first_nonconvex_point(eps: np.ndarray, dlt: np.ndarray, rtol: float = CONVEX_RTOL) -> int | None:
    """Index of the grid point where delta is most above the chord of its neighbours, if
    that is by more than ``rtol`` (relative); ``None`` if the samples are convex in x."""
    excess, j = convexity_excess(eps, dlt)
    return j if excess > rtol else None


#: Left-half outcomes with P0 + P1 below this are float rounding of the polygon near its
#: fixed point (a vertex an ulp off the diagonal): the optimistic pair merges each with
#: its mirror image.
ROUNDING_MASS = 1e-14


def symmetric_pair_from_curve(curve, *, merge_rounding: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(log P0, log P1) of a discrete pair with T(P0||P1) = ``curve`` (a symmetric polygon).

    Fact (c) of the module docstring: the left half of the polygon, up to the
    fixed point alpha* = f(alpha*), gives outcomes (P0, P1) = (d0_k, d1_k) with
    d0_k = alpha_k - alpha_{k-1} and d1_k = beta_{k-1} - beta_k (from the
    complements 1 - beta where beta > 1/2, so that small masses keep their
    relative precision), plus the certain outcome (0, 1 - f(0)); the right half
    is their mirror image (d1_k, d0_k), (1 - f(0), 0).

    A vertex an ulp off the diagonal leaves a spurious outcome of mass ~1e-17, e.g.
    (5e-17, 0): a loss of +inf that randomized response does not have. With
    ``merge_rounding`` (the optimistic pair) each left outcome below ``ROUNDING_MASS``
    is merged with its mirror image (d1, d0) into one outcome (d0 + d1, d0 + d1) of
    loss 0. Merging outcomes is a post-processing, so the merged pair is dominated by
    the unmerged one (sound for a lower bound, never for an upper one), and the other
    outcomes, whose losses are the polygon's slopes, are untouched. The pessimistic
    pair keeps them (sound, only looser below delta ~ 1e-16).
    """
    a, b = curve.alpha, curve.beta
    bc = curve._beta_c  # 1 - beta, kept without cancellation by PiecewiseLinearCurve
    k = int(np.argmax(a >= b))  # first vertex on or right of the diagonal
    p_inf = float(bc[0])
    if k == 0:
        a_star = 0.0
        a_l, b_l, bc_l = np.array([0.0]), np.array([0.0]), np.array([1.0])
    else:
        gap0, gap1 = b[k - 1] - a[k - 1], b[k] - a[k]  # > 0, <= 0
        t = gap0 / (gap0 - gap1)
        a_star = float(a[k - 1] + t * (a[k] - a[k - 1]))
        a_l = np.append(a[:k], a_star)
        b_l = np.append(b[:k], a_star)
        bc_l = np.append(bc[:k], 1.0 - a_star)
    d0 = np.clip(np.diff(a_l), 0.0, None)
    d1 = np.clip(np.where(b_l[:-1] <= 0.5, -np.diff(b_l), np.diff(bc_l)), 0.0, None)
    centre = []
    if merge_rounding:
        tiny = (d0 + d1) <= ROUNDING_MASS
        if np.any(tiny):
            centre = [float(np.sum(d0[tiny]) + np.sum(d1[tiny]))]
            d0, d1 = d0[~tiny], d1[~tiny]
    p0 = np.concatenate([[0.0], d0, centre, d1, [p_inf]])
    p1 = np.concatenate([[p_inf], d1, centre, d0, [0.0]])
    with np.errstate(divide="ignore"):
        return np.log(p0), np.log(p1)


def lower_profile(eps: np.ndarray, dlt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points (eps_v, low(eps_v)) of the lower bound (1) on a convex profile (module docstring).

    Args:
      eps: grid 0 = eps_0 < ... < eps_m (m >= 1).
      dlt: delta at the grid, non-increasing, in [0, 1].

    Returns:
      eps_v, low_v: the grid points with their delta, and the kinks of low
      inside each interval and beyond eps_m, with low there (all <= delta).
    """
    x = np.exp(eps)
    # symmetric extension one step left of eps_0 = 0
    x_ext = np.concatenate([[math.exp(-eps[1])], x])
    d_ext = np.concatenate([[1.0 - math.exp(-eps[1]) * (1.0 - dlt[1])], dlt])
    slope = np.diff(d_ext) / np.diff(x_ext)  # slope[j]: secant of [x_ext[j], x_ext[j+1]]
    m = eps.size - 1
    xi, xj, di, dj = x[:-1], x[1:], dlt[:-1], dlt[1:]  # interval i = [x_i, x_{i+1}], i = 0..m-1
    s_left = slope[:m]  # secant of interval i-1 (through (x_i, d_i))
    s_right = np.concatenate([slope[2 : m + 1], [np.nan]])  # secant of interval i+1 (through (x_{i+1}, d_{i+1}))

    def low(y: np.ndarray) -> np.ndarray:
        left = di + s_left * (y - xi)
        right = np.where(np.isnan(s_right), -np.inf, dj + np.nan_to_num(s_right) * (y - xj))
        return np.maximum(np.maximum(left, right), 0.0)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        cross = (dj - di + s_left * xi - s_right * xj) / (s_left - s_right)
        zero_left = np.where(s_left < 0.0, xi - di / s_left, np.nan)
        zero_right = np.where(s_right < 0.0, xj - dj / s_right, np.nan)
    cand_x, cand_d = [x], [dlt]
    for y in (cross, zero_left, zero_right):
        ok = np.isfinite(y) & (y > xi) & (y < xj)
        yy = np.where(ok, y, xi)
        cand_x.append(y[ok])
        cand_d.append(low(yy)[ok])
    s_last = slope[-1]  # secant of [x_{m-1}, x_m]
    if s_last < 0.0:
        cand_x.append(np.array([x[-1] - dlt[-1] / s_last]))
        cand_d.append(np.array([0.0]))
    vx = np.concatenate(cand_x)
    vd = np.clip(np.concatenate(cand_d), 0.0, 1.0)
    keep = np.isfinite(vx) & (vx >= 1.0) & (vx <= math.exp(MAX_EPSILON))
    vx, vd = vx[keep], vd[keep]
    last = int(np.argmax(vx))
    if vd[last] > 0.0:
        # low reaches 0 only beyond e^MAX_EPSILON: end it at 0 there instead (below the
        # last secant, so still <= delta). Without a zero the (eps, delta) envelope would
        # keep delta = vd[last] for every larger eps, above the truth.
        vx, vd = np.append(vx, math.exp(MAX_EPSILON)), np.append(vd, 0.0)
    return np.log(vx), vd


def step_lower_profile(eps: np.ndarray, dlt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points (eps_i, delta_{i+1}) and (eps_m, 0): a lower bound on the profile of the
    least private mechanism a non-increasing delta allows, assuming nothing else.

    On (eps_i, eps_{i+1}] a non-increasing delta is >= delta_{i+1}, and beyond eps_m
    >= 0. The lines of (a) for a smaller delta and a smaller eps are higher, so the
    envelope of these points is >= sup over all eps of the lines of delta: a curve
    above the mechanism's, whose pair is dominated by it (fact (b)).
    """
    return eps.copy(), np.append(dlt[1:], 0.0)
