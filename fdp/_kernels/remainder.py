"""Numba kernel: lower bounds on the remainders of the lattice classes of a Gaussian term.

For class k with Y in (lo_k, hi_k] and W = exp(mu Y - mu^2/2) in [lo_w_k, hi_w_k)
(within the relative ``xi``), phi the standard normal density, the remainders are

    b_k    = E_Q[W - lo_w_k (1 - xi) ; k] >= lo_w_k (1 - xi) int expm1(mu (y - lo_k)) phi(y) dy - ...,
    bbar_k = E_Q[hi_w_k (1 + xi) - W ; k] >= hi_w_k (1 - xi) int -expm1(mu (y - hi_k)) phi(y) dy - ...,

the integrals by a Gauss-Legendre rule (the fewest nodes whose error bound is
negligible, up to the most offered), less its error bound and the float
error, less ``moved`` (the class ends are the thresholds y'_k of the computed masses,
within ``shift`` of lo_k, hi_k). The bounds and their proofs are
:func:`fdp.mechanisms.allocation_terms.gaussian_term_law`'s; this is the same arithmetic
in one fused pass (NumPy spent ~1 us per class on temporaries, which a mixture of
many components, the JL mechanism's, multiplies).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["class_remainders"]

_INV_SQRT_2PI = 0.3989422804014327
_U = 2.0**-53


@njit(cache=True)
def _rule(y_lo, y_hi, mu, nodes, weights):  # pragma: no cover - numba
    half = 0.5 * (y_hi - y_lo)
    mid = 0.5 * (y_hi + y_lo)
    left = 0.0
    right = 0.0
    for j in range(nodes.size):
        y = mid + half * nodes[j]
        density = math.exp(-0.5 * y * y) * _INV_SQRT_2PI
        left += weights[j] * math.expm1(mu * (y - y_lo)) * density
        right -= weights[j] * math.expm1(mu * (y - y_hi)) * density
    return half * abs(left), half * abs(right)


@njit(cache=True)
def class_remainders(lo, hi, lo_w, hi_w, a, mu, xi, shift, nodes, weights, log_c, tolerance):  # pragma: no cover - numba
    """(b, bbar) lower bounds of the module docstring, clipped at 0 (0 where anything overflows).

    ``nodes``, ``weights``, ``log_c``: rows of Gauss-Legendre rules of increasing order
    (NaN-padded) and the log constants of their error bounds; each class takes the first
    rule whose bound is below ``tolerance`` times the integrals' scale mu h^2 phi(mid) / 2,
    or the last. Any rule is sound: its bound is what is charged."""
    n_classes = lo.size
    b = np.zeros(n_classes)
    bbar = np.zeros(n_classes)
    for k in range(n_classes):
        y_lo = lo[k]
        y_hi = hi[k]
        if not y_hi > y_lo:
            continue
        half = 0.5 * (y_hi - y_lo)
        mid = 0.5 * (y_hi + y_lo)
        nearest = min(max(0.0, y_lo - 1.0), y_hi + 1.0)
        grow = mu * (y_hi - y_lo + 1.0)
        if grow > 700.0:  # no useful bound: the remainders stay 0
            continue
        # the rule's error: h^{2n+1} (n!)^4 / ((2n+1) ((2n)!)^2) M / R^{2n}, R = 1, M a bound on
        # the integrand's modulus within distance 1 of [lo, hi]
        bound_m = (math.exp(grow) + 1.0) * math.exp(0.5) * _INV_SQRT_2PI * math.exp(-0.5 * nearest * nearest)
        log_h = math.log(y_hi - y_lo)
        # the integrals are ~ mu h^2 phi(mid) / 2: a rule is enough when its bound is tolerance of that
        scale_here = tolerance * 0.5 * mu * (y_hi - y_lo) ** 2 * math.exp(-0.5 * mid * mid) * _INV_SQRT_2PI
        row = nodes.shape[0] - 1
        for r in range(nodes.shape[0]):
            order = 0
            while order < nodes.shape[1] and math.isfinite(nodes[r, order]):
                order += 1
            if math.exp(min((2 * order + 1) * log_h + log_c[r], 700.0)) * bound_m <= scale_here:
                row = r
                break
        order = 0
        while order < nodes.shape[1] and math.isfinite(nodes[row, order]):
            order += 1
        log_rule = (2 * order + 1) * log_h + log_c[row]
        if log_rule > 700.0:
            continue
        left, right = _rule(y_lo, y_hi, mu, nodes[row, :order], weights[row, :order])
        error = math.exp(log_rule) * bound_m
        # the float sum of n positive terms, each a few roundings off, at nodes and weights a few
        # ulp off (the integrand's relative change there is <= (mu + |y|) |y| u per ulp of y)
        scale = 1.0 + (mu + abs(mid) + half) * (abs(mid) + half)
        error += 64 * _U * scale * max(left, right)
        if not (math.isfinite(left) and math.isfinite(right) and math.isfinite(error)):
            continue
        # moving an end by <= shift: at the right end the integrand is <= (k+1) spacing (1 + xi)^2
        # - k spacing (1 - xi), at the left |W - lo_w (1 - xi)| <= 3 xi lo_w
        d_lo = math.exp(-0.5 * (abs(y_lo) - shift) ** 2) * _INV_SQRT_2PI if math.isfinite(y_lo) else 0.0
        d_hi = math.exp(-0.5 * (abs(y_hi) - shift) ** 2) * _INV_SQRT_2PI if math.isfinite(y_hi) else 0.0
        moved = 1.01 * shift * (d_hi * ((hi_w[k] - lo_w[k]) * (1 + xi) + 3 * hi_w[k] * xi) + d_lo * 3 * lo_w[k] * xi)
        b[k] = max(0.0, lo_w[k] * (left - error) * (1 - xi) * (1 - 4 * _U) - moved - 4 * _U * a[k] * lo_w[k])
        bbar[k] = max(0.0, hi_w[k] * (right - error) * (1 - xi) * (1 - 4 * _U) - moved - 4 * _U * a[k] * hi_w[k])
    return b, bbar
