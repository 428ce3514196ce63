"""A discrete privacy-loss distribution on a uniform grid, and its (eps, delta).

The PLD of a pair (P, Q) is the law of L = log(dP/dQ)(X), X ~ P. Here it is a
sub-probability vector ``pmf`` on the grid ell_k = (offset + k) h plus an atom
``p_inf`` at +inf. Its hockey-stick divergence is

    delta(eps) = p_inf + sum_k pmf_k * (1 - e^{eps - ell_k})_+            (1)

(DESIGN.md, "The maths in one page"). ``delta_shift`` is a signed correction
added to (1): composition charges mass that may have wrapped around the FFT
there (positive for pessimistic PLDs, negative for optimistic ones).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from fdp._validation import check_array, check_delta

__all__ = ["DiscretePLD"]


@dataclass(frozen=True, eq=False)
class DiscretePLD:
    """Atoms ``pmf[k]`` at losses (offset + k) * h, an atom ``p_inf`` at +inf."""

    h: float
    offset: int
    pmf: np.ndarray
    p_inf: float = 0.0
    delta_shift: float = 0.0
    #: Part of p_inf (pessimistic) or of -delta_shift (optimistic) that is float
    #: round-off of the FFT: no delta below it can be certified.
    round_off: float = 0.0

    @property
    def losses(self) -> np.ndarray:
        return (self.offset + np.arange(self.pmf.size, dtype=np.float64)) * self.h

    @property
    def finite_mass(self) -> float:
        return float(self.pmf.sum())

    @functools.cached_property
    def _moments(self) -> tuple[float, float]:
        return _mean_variance(self.pmf, self.offset, self.h)

    def mean(self) -> float:
        """E[L ; L finite] / P(L finite): mean of the finite part."""
        return self._moments[0]

    def variance(self) -> float:
        """Variance of the finite part (normalised to a probability)."""
        return self._moments[1]

    def log_mgf(self, lam: np.ndarray) -> np.ndarray:
        """log E[e^{lam L} ; L finite] for each lam (log of the sub-probability MGF)."""
        lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
        return _log_mgf(self.pmf, self.offset, self.h, lam)

    def delta(self, epsilon: float | np.ndarray) -> np.ndarray | float:
        """delta(eps) of equation (1), vectorised over eps (any real eps)."""
        eps = check_array("epsilon", epsilon, allow_inf=False)
        out = _delta_at(self.pmf, self.offset, self.h, np.atleast_1d(eps).ravel())
        out = np.clip(out + self.p_inf + self.delta_shift, 0.0, 1.0)
        return float(out[0]) if eps.ndim == 0 else out.reshape(eps.shape)

    def epsilon(self, delta: float) -> float:
        """Smallest eps >= 0 with delta(eps) <= ``delta`` (inf if none exists)."""
        target = check_delta(delta) - self.p_inf - self.delta_shift
        if target <= 0.0:
            return math.inf
        return max(0.0, _epsilon_for(self.pmf, self.offset, self.h, target))


@njit(cache=True)
def _mean_variance(pmf, offset, h):  # pragma: no cover - numba
    """(mean, variance) of the normalised finite part, in one pass (shifted sums)."""
    n = pmf.shape[0]
    mass = 0.0
    s1 = 0.0
    s2 = 0.0
    centre = 0.5 * (n - 1)  # shift keeps the sums well conditioned
    for k in range(n):
        w = pmf[k]
        if w != 0.0:
            d = k - centre
            mass += w
            s1 += w * d
            s2 += w * d * d
    if mass <= 0.0:
        return 0.0, 0.0
    m1 = s1 / mass
    return (offset + centre + m1) * h, max(s2 / mass - m1 * m1, 0.0) * h * h


@njit(cache=True)
def _delta_at(pmf, offset, h, eps):  # pragma: no cover - numba
    """Direct sum of (1) for each eps: sum over atoms above eps of pmf (1 - e^{eps - ell})."""
    n = pmf.shape[0]
    out = np.zeros(eps.shape[0])
    for e in range(eps.shape[0]):
        start = int(math.floor(eps[e] / h)) - offset + 1
        if start < 0:
            start = 0
        acc = 0.0
        for k in range(start, n):
            d = eps[e] - (offset + k) * h
            if d < 0.0:
                acc += pmf[k] * -math.expm1(d)
        out[e] = acc
    return out


@njit(cache=True)
def _epsilon_for(pmf, offset, h, target):  # pragma: no cover - numba
    """Solve sum_k pmf_k (1 - e^{eps - ell_k})_+ = target for eps (exact on the grid).

    Walk down from the top keeping S0 = sum_{k>j} pmf_k and W = sum_{k>j} pmf_k e^{ell_j - ell_k};
    delta(ell_j) = S0 - W. In the cell (ell_j, ell_{j+1}], delta(eps) = S0 - e^{eps - ell_j} W.
    """
    n = pmf.shape[0]
    s0 = 0.0
    w = 0.0
    eh = math.exp(-h)
    for j in range(n - 1, -1, -1):
        # move from level j+1 to level j: atoms above j now include k = j+1.. handled below
        s0_next = s0 + pmf[j]
        w_next = (w + pmf[j]) * eh
        # atoms strictly above ell_{j-1} are k >= j: delta(ell_{j-1}) = s0_next - w_next
        if s0_next - w_next > target:
            # solution in (ell_{j-1}, ell_j]; there delta = s0_next - e^{eps - ell_{j-1}} w_next
            base = (offset + j - 1) * h
            if w_next <= 0.0:  # e^{-h} underflowed: delta stays above target up to ell_j
                return base + h
            return min(base + math.log((s0_next - target) / w_next), base + h)
        s0 = s0_next
        w = w_next
    # delta(eps) <= target already below the grid: solve with all atoms, eps < ell_0 - h
    if w <= 0.0:
        return -math.inf
    base = (offset - 1) * h
    if s0 <= target:
        return -math.inf
    return base + math.log((s0 - target) / w)


@njit(cache=True)
def _log_mgf(pmf, offset, h, lam):  # pragma: no cover - numba
    """An upper bound on log sum_k pmf_k e^{lam ell_k}, tight to ~1e-12 relative.

    Factoring out e^{lam ell_ref} with ell_ref the top (lam > 0) or bottom (lam < 0)
    of the support keeps every factor <= 1; the factors are powers of
    r = e^{-|lam| h}, built by repeated multiplication (no exp per term). That
    recurrence has relative error <= n * 2^-52, which is added to the result so
    that Chernoff bounds built on it stay upper bounds. Once the factor has
    fallen below 1e-18 of the sum, the remaining terms are bounded by factor *
    (total mass) and added instead of summed (an upper bound, and an early exit).
    """
    n = pmf.shape[0]
    first = 0
    while first < n and pmf[first] <= 0.0:
        first += 1
    last = n - 1
    while last >= first and pmf[last] <= 0.0:
        last -= 1
    m = lam.shape[0]
    out = np.empty(m)
    if first > last:
        out[:] = -math.inf
        return out
    lo = (offset + first) * h
    hi = (offset + last) * h
    guard = 4.0 * (last - first + 2) * 2.220446049250313e-16
    total = 0.0
    for k in range(first, last + 1):
        total += pmf[k]
    for i in range(m):
        r = math.exp(-abs(lam[i]) * h)
        acc = 0.0
        f = 1.0
        if lam[i] > 0.0:
            for k in range(last, first - 1, -1):
                acc += pmf[k] * f
                f *= r
                if f * total < 1e-18 * acc:  # the rest adds < f * total: bound it, stop
                    acc += f * total
                    break
            ref = hi
        else:
            for k in range(first, last + 1):
                acc += pmf[k] * f
                f *= r
                if f * total < 1e-18 * acc:
                    acc += f * total
                    break
            ref = lo
        out[i] = lam[i] * ref + math.log(acc) + guard
    return out
