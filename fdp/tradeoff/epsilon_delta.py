"""From (eps, delta) guarantees to tradeoff curves.

(eps, delta)-DP is exactly f_{eps,delta}-DP with (Dong-Roth-Su,
arXiv:1905.02383v3, Proposition 2.5, after Wasserman and Zhou)

    f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)),

and a family of guarantees (eps_i, delta_i) holding together is the pointwise
maximum of these curves. Conversely a curve is recovered from its delta(eps)
(ibid., primal-dual section; Proposition 2.12 there gives the other direction,
delta(eps) = 1 + f*(-e^eps)):

    f(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha).

Both are upper envelopes of finitely many lines here, so the results are exact
:class:`~fdp.tradeoff.piecewise.PiecewiseLinearCurve` objects, computed by the
dual lower-hull construction (no loop over lines).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fdp._kernels.hull import lower_hull_indices
from fdp._validation import check_array, check_integer
from fdp.tradeoff.piecewise import PiecewiseLinearCurve, convex_minimum

__all__ = ["composed_tradeoff", "epsilon_delta_curve", "from_delta", "profile_envelope"]

#: Lines 1 - delta - e^eps alpha with eps above this are dropped: they are
#: positive only for alpha < e^-700 ~ 1e-304. Dropping a line lowers f (safe).
_MAX_STEEP_EPS = 700.0


def _upper_envelope(slope: np.ndarray, icpt: np.ndarray, icpt_c: np.ndarray) -> PiecewiseLinearCurve:
    """Exact upper envelope on [0, 1] of the lines y = icpt + slope * alpha (and y = 0).

    ``icpt_c`` = 1 - icpt, computed by the caller without cancellation.

    Duality: line i is on the envelope iff (slope_i, icpt_i) is on the upper
    convex hull of the points (slope, icpt), i.e. on the lower hull of
    (slope, -icpt). Consecutive hull lines k, k+1 (increasing slope) cross at
    alpha_k = (icpt_k - icpt_{k+1}) / (slope_{k+1} - slope_k), increasing in k;
    those in (0, 1), plus alpha = 0 and 1, are the polygon's vertices.
    """
    slope = np.append(slope, 0.0)
    icpt = np.append(icpt, 0.0)
    icpt_c = np.append(icpt_c, 1.0)
    idx = lower_hull_indices(slope, -icpt)  # increasing slope
    s, c, cc = slope[idx], icpt[idx], icpt_c[idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (c[:-1] - c[1:]) / (s[1:] - s[:-1])
    inside = (cross > 0.0) & (cross < 1.0)
    xk, sk, ck, cck = cross[inside], s[:-1][inside], c[:-1][inside], cc[:-1][inside]
    at0 = int(np.argmax(c))
    at1 = int(np.argmax(c + s))
    a = np.concatenate([[0.0], xk, [1.0]])
    b = np.concatenate([[c[at0]], ck + sk * xk, [max(c[at1] + s[at1], 0.0)]])
    bc = np.concatenate([[cc[at0]], cck - sk * xk, [min(cc[at1] - s[at1], 1.0)]])
    return PiecewiseLinearCurve._from_vertices(a, b, 1.0 - a, bc)


def _lines(eps: np.ndarray, delta: np.ndarray, symmetric: bool) -> tuple[np.ndarray, ...]:
    steep = eps <= _MAX_STEEP_EPS
    e1 = eps[steep]
    # 1 - delta - e^eps alpha
    s1, c1, cc1 = -np.exp(e1), 1.0 - delta[steep], delta[steep]
    if not symmetric:
        return s1, c1, cc1
    # e^-eps (1 - delta - alpha); 1 - intercept = (1 - e^-eps) + e^-eps delta
    w = np.exp(-eps)
    s2, c2, cc2 = -w, w * (1.0 - delta), -np.expm1(-eps) + w * delta
    return np.concatenate([s1, s2]), np.concatenate([c1, c2]), np.concatenate([cc1, cc2])


def profile_envelope(epsilon: np.ndarray, delta: np.ndarray) -> PiecewiseLinearCurve:
    """f(alpha) = max_i max(0, 1 - delta_i - e^{eps_i} alpha) for real eps_i (negative too).

    For a pair (P, Q) with delta(eps) = H_{e^eps}(P || Q) <= delta_i at eps_i, every
    line is below T(P, Q) (Neyman-Pearson: beta >= 1 - delta(eps) - e^eps alpha for
    every test), so the result is a lower bound on the tradeoff curve, and it is
    exact when the eps_i include every breakpoint (for a discrete PLD, its losses)
    and delta_i = delta(eps_i). A valid tradeoff curve by construction (convex,
    non-increasing, <= 1 - alpha), whatever round-off the delta_i carry.
    """
    eps = np.asarray(epsilon, dtype=np.float64).ravel()
    dlt = np.clip(np.asarray(delta, dtype=np.float64).ravel(), 0.0, 1.0)
    finite = np.isfinite(eps)
    return _upper_envelope(*_lines(eps[finite], dlt[finite], symmetric=False))


def composed_tradeoff(plds: dict[Any, Any]) -> PiecewiseLinearCurve:
    """g = min{f, f^-1}** from the pessimistic composed PLD of each direction.

    f is :func:`profile_envelope` of the remove direction's certified profile at its
    grid losses (``DiscretePLD.profile_on_grid``, round-off charges included), f^-1
    the inverse of the add direction's; each lies below the true curve, so g does.
    One direction (a symmetric composition): its envelope, symmetrised.
    """
    from fdp.pld.cells import Direction

    curves = []
    for direction, pld in plds.items():
        curve = profile_envelope(*pld.profile_on_grid())
        curves.append(curve if Direction(direction) is Direction.REMOVE else curve.inverse())
    if len(curves) == 1:
        return curves[0].symmetrized()
    return convex_minimum(curves[0], curves[1]).symmetrized()


def epsilon_delta_curve(epsilon: Any, delta: Any) -> PiecewiseLinearCurve:
    """The curve of (eps_i, delta_i)-DP holding for all i: max_i f_{eps_i, delta_i}.

        f(alpha) = max_i max(0, 1 - delta_i - e^{eps_i} alpha, e^{-eps_i}(1 - delta_i - alpha))

    (Dong-Roth-Su, arXiv:1905.02383v3, Proposition 2.5). Exact polygon. Pairs
    broadcast together; scalars give the single curve f_{eps,delta} (for
    delta = 0 and eps = eps0 this is the curve of randomized response).

    Args:
      epsilon: eps_i >= 0, finite; scalar or array.
      delta: delta_i in [0, 1]; scalar or array (broadcast with epsilon).

    Raises:
      ValueError: NaN/infinite/negative epsilon, delta outside [0, 1], or
        shapes that do not broadcast.
    """
    eps = check_array("epsilon", epsilon, low=0.0)
    dlt = check_array("delta", delta, low=0.0, high=1.0)
    try:
        eps, dlt = np.broadcast_arrays(eps, dlt)
    except ValueError:
        raise ValueError(
            f"epsilon and delta must broadcast together; got shapes {eps.shape} and {dlt.shape}"
        ) from None
    return _upper_envelope(*_lines(eps.ravel(), dlt.ravel(), symmetric=True))


def _default_epsilons(delta_fn: Callable[[np.ndarray], np.ndarray], num: int) -> np.ndarray:
    """[0, eps_max] uniformly, eps_max the first of 1, 2, 4, ..., 512 with delta <= 1e-20."""
    probe = 2.0 ** np.arange(0, 10)
    small = delta_fn(probe) <= 1e-20
    eps_max = probe[int(np.argmax(small))] if np.any(small) else probe[-1]
    return np.linspace(0.0, eps_max, num)


def from_delta(
    delta_of_epsilon: Callable[[Any], Any],
    *,
    epsilons: Any = None,
    num_points: int = 4097,
    symmetric: bool = True,
) -> PiecewiseLinearCurve:
    """The tradeoff curve of a privacy profile: f(alpha) = sup_eps max(0, 1 - delta(eps) - e^eps alpha).

    Dong-Roth-Su, arXiv:1905.02383v3, primal-dual section: a mechanism that
    is (eps, delta(eps))-DP for every eps is f-DP with this f (the pointwise
    maximum of the curves f_{eps, delta(eps)} of Proposition 2.5). With
    ``symmetric=True`` (the default; right for a delta(eps) that holds for both
    orderings of neighbours and is given for eps >= 0 only) the lines of the
    negative epsilons are included through the symmetry f = f^-1, i.e. the
    curve is max_eps f_{eps, delta(eps)} with the e^-eps (1 - delta - alpha)
    branch. With ``symmetric=False`` only the lines 1 - delta(eps) - e^eps alpha,
    eps >= 0, are used.

    Which way a finite grid errs: the supremum is taken over the grid of eps
    only, so the result is the *lower* envelope side, f_grid <= f (sound for
    privacy, never claims more than the profile gives), exact at every alpha
    whose tangent slope is -e^{eps_i} for a grid point, and the delta
    recovered from f_grid equals delta at the grid points and is >= delta
    between them. The error between grid points is O(h^2) for spacing h.

    Args:
      delta_of_epsilon: eps -> delta(eps) in [0, 1]; should accept a NumPy
        array (a scalar-only callable is applied elementwise).
      epsilons: the grid (eps >= 0, finite). Default: ``num_points`` uniform
        points on [0, eps_max], eps_max the first power of two (1 .. 512) where
        delta(eps) <= 1e-20.
      num_points: size of the default grid (>= 2).
      symmetric: include the e^-eps (1 - delta - alpha) branch.

    Returns:
      An exact PiecewiseLinearCurve (the envelope of the grid's lines).

    Raises:
      TypeError: delta_of_epsilon is not callable.
      ValueError: bad grid, or delta_of_epsilon returns values outside [0, 1] or NaN.
    """
    if not callable(delta_of_epsilon):
        raise TypeError(f"delta_of_epsilon must be callable; got {type(delta_of_epsilon).__name__}")

    def delta_fn(e: np.ndarray) -> np.ndarray:
        try:
            out = np.asarray(delta_of_epsilon(e), dtype=np.float64)
            out = np.broadcast_to(out, e.shape)
        except (TypeError, ValueError):
            out = np.array([float(delta_of_epsilon(float(x))) for x in e.ravel()]).reshape(e.shape)
        return check_array("delta_of_epsilon(epsilon)", out, low=0.0, high=1.0)

    if epsilons is None:
        n = check_integer("num_points", num_points, low=2)
        grid = _default_epsilons(delta_fn, n)
    else:
        grid = np.unique(check_array("epsilons", epsilons, low=0.0).ravel())
        if grid.size == 0:
            raise ValueError("epsilons must contain at least one value; got an empty array")
    return _upper_envelope(*_lines(grid, delta_fn(grid), symmetric=bool(symmetric)))
