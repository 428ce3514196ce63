"""A discrete privacy-loss distribution on a uniform grid, and its (eps, delta).

The PLD of a pair (P, Q) is the law of L = log(dP/dQ)(X), X ~ P. Here it is a
sub-probability vector ``pmf`` on the grid ell_k = (offset + k) h plus an atom
``p_inf`` at +inf. Its hockey-stick divergence is

    delta(eps) = p_inf + sum_k pmf_k * (1 - e^{eps - ell_k})_+            (1)

(docs/accountant.md, "The maths in short"). ``delta_shift`` is a signed correction
added to (1): composition charges mass that may have wrapped around the FFT
there (positive for pessimistic PLDs, negative for optimistic ones).

A composed PLD is a *bound*: ``bound = +1`` (upper) or ``-1`` (lower). Its float
round-off is charged on the safe side (:mod:`fdp.pld.roundoff`) as

    delta_hi(eps) = (1 + rel_error) [ (1) + c(eps) ],   = 1 for eps < eps_from,
    delta_lo(eps) = [ (1) - c(eps) ] / (1 + rel_error),
    c(eps)        = exp(log_charge - tilt * max(eps, eps_from)),               (2)

where ``tilt`` > 0 for a composition done on exponentially tilted vectors (the
charge then falls with eps like the tail it protects). ``rel_error`` covers the
relative round-off of the inputs and of the sums in (1); ``loss_error`` bounds how
far the computed grid losses (offset + k) h can be from the exact ones, and is
charged to eps (upper bounds move up, lower bounds down).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from fdp._kernels.gate import gated
from fdp._validation import check_array, check_delta
from fdp.pld.roundoff import U

#: The least positive float64 (2^-1074): an absolute error bound per rounding in the subnormal range.
_TINY = math.ulp(0.0)

__all__ = ["DiscretePLD"]

#: First step (relative) by which epsilon() moves an answer until its own delta
#: check passes: the solver and delta() round differently, by ~1e-11 relative at
#: the ~1e6-point windows of heavy tails; the step doubles, so it is never stuck.
SOLVER_STEP = 1e-12


@dataclass(frozen=True, eq=False)
class DiscretePLD:
    """Atoms ``pmf[k]`` at losses (offset + k) * h, an atom ``p_inf`` at +inf."""

    h: float
    offset: int
    pmf: np.ndarray
    p_inf: float = 0.0
    delta_shift: float = 0.0
    #: Part of p_inf (pessimistic) or of -delta_shift (optimistic) that is float
    #: round-off of the FFT (untilted compositions).
    round_off: float = 0.0
    #: +1: delta is an upper bound (charges added), -1: a lower bound, 0: exact.
    bound: int = 0
    #: The charge (2).
    tilt: float = 0.0
    log_charge: float = -math.inf
    eps_from: float = -math.inf
    rel_error: float = 0.0
    loss_error: float = 0.0

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

    def charge(self, epsilon: np.ndarray) -> np.ndarray:
        """c(eps) of (2), the round-off charged at each eps."""
        if self.log_charge == -math.inf:
            return np.zeros_like(epsilon, dtype=np.float64)
        with np.errstate(over="ignore"):
            return np.exp(self.log_charge - self.tilt * np.maximum(epsilon, self.eps_from))

    def delta(self, epsilon: float | np.ndarray) -> np.ndarray | float:
        """delta(eps) of equation (1), with the charges (2) of a bound; any real eps."""
        eps = check_array("epsilon", epsilon, allow_inf=False)
        flat = np.atleast_1d(eps).ravel()
        side = self.bound
        if side == 0:
            out = _delta_at(self.pmf, self.offset, self.h, flat) + self.p_inf + self.delta_shift
            out = np.clip(out, 0.0, 1.0)
            return float(out[0]) if eps.ndim == 0 else out.reshape(eps.shape)

        def safe(x):  # one float towards the bound's side: brackets a round-to-nearest result
            return np.nextafter(x, side * np.inf)

        # the grid losses are known to within loss_error: evaluate where that is safe
        # (each later float step, rounded to nearest, is stepped to the bound's side, as
        # in :meth:`profile_on_grid`: a negative delta_shift may cancel most of the sum)
        at = np.nextafter(flat - side * self.loss_error, -side * np.inf)
        out = safe(safe(_delta_at(self.pmf, self.offset, self.h, at) + self.p_inf) + self.delta_shift)
        charge = self._charge_bound(at)
        if side > 0:
            out = safe(safe(out + charge) * safe(1.0 + self.rel_error))
            out[at < self.eps_from] = 1.0
        else:
            out = safe(safe(out - charge) / np.nextafter(1.0 + self.rel_error, np.inf))
        out = np.clip(out, 0.0, 1.0)
        return float(out[0]) if eps.ndim == 0 else out.reshape(eps.shape)

    def profile_on_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """(eps_j, delta(eps_j)) at eps_j = ell_j + loss_error for every grid loss, in O(n).

        The same bound as :meth:`delta` (which would take O(n) per point). The sum
        over the atoms strictly above ell_j obeys, with q = e^{-h} and S_j their mass,

            T_j = sum_{k>j} pmf_k (1 - q^{k-j}) = (1 - q) S_j + q T_{j+1},

        a recursion of positive terms. An atom's share reaches T_j through at most
        k - j + 1 additions into S, one product by fl(1 - q) and an addition into T,
        then k - j steps of a product by fl(q) (within 1 ulp of q) and an addition:
        <= 4 (n + 2) roundings of relative size u = 2^-53, so the computed T_j is
        within a factor 1 + kappa, kappa = 4 (n + 2) u, of the exact one; a product
        that underflows errs instead by <= 2^-1075 absolutely, <= n 2^-1074 in all.
        Both are charged on the bound's side; so is every later float step (the
        additions of ``p_inf``, ``delta_shift`` and the charge, the factor
        1 + ``rel_error``, and eps_j = ell_j + bound * loss_error itself): each is
        rounded to nearest, so stepping its result one float towards the safe side
        (:func:`numpy.nextafter`) gives a value on that side of the exact one, and
        the later steps are monotone in it. An upper bound then has delta_j >= the
        delta of the exact PLD at eps_j; a lower bound delta_j <= it, at an eps_j
        below the exact breakpoint ell_j - loss_error (what :mod:`fdp.risk` needs).
        """
        side = self.bound
        tail = _grid_tail_delta(self.pmf, self.h)
        at = self.losses
        if side == 0:
            out = tail + self.p_inf + self.delta_shift
            return at, np.clip(out, 0.0, 1.0)
        kappa = 4.0 * (self.pmf.size + 2) * U
        underflow = self.pmf.size * _TINY

        def safe(x):  # one float towards the bound's side: brackets a round-to-nearest result
            return np.nextafter(x, side * np.inf)

        if side > 0:
            tail = safe(safe(tail * (1.0 + kappa)) + underflow)
        else:
            tail = np.maximum(safe(safe(tail / (1.0 + kappa)) - underflow), 0.0)
        out = safe(safe(tail + self.p_inf) + self.delta_shift)
        charge = self._charge_bound(at)
        if side > 0:
            out = safe(safe(out + charge) * safe(1.0 + self.rel_error))
            out[at < self.eps_from] = 1.0
        else:
            out = safe(safe(out - charge) / np.nextafter(1.0 + self.rel_error, np.inf))
        return safe(at + side * self.loss_error), np.clip(out, 0.0, 1.0)

    def _charge_bound(self, at: np.ndarray) -> np.ndarray:
        """An upper bound on c(at) of (2) despite the float steps of :meth:`charge`: its
        exponent log_charge - tilt * max(at, eps_from) is within 2u (|log_charge| +
        |tilt * at|) of the exact one, each exp within 1 ulp (charged as 8u, twice), and
        the product by the factor e^{4u (|log_charge| + |tilt * at| + 8)} adds one
        rounding, stepped up."""
        c = self.charge(at)
        if self.log_charge == -math.inf:
            return c
        arg = abs(self.log_charge) + self.tilt * np.abs(np.maximum(at, self.eps_from))
        with np.errstate(over="ignore"):
            return np.nextafter(c * np.exp(4.0 * U * (arg + 8.0)), np.inf)

    def epsilon(self, delta: float) -> float:
        """Smallest eps >= 0 with delta(eps) <= ``delta`` (inf if none exists).

        For an upper bound, the eps returned is one where :meth:`delta` is <= ``delta``
        (checked by evaluating it); for a lower bound, one below which :meth:`delta` is
        > ``delta``; so each is a bound on the exact eps whatever the solver's round-off.
        """
        delta = check_delta(delta)
        if self.bound == 0 or (self.log_charge == -math.inf and self.rel_error == 0.0
                               and self.loss_error == 0.0 and self.eps_from == -math.inf):
            return self._solve(delta - self.p_inf - self.delta_shift)
        return self._upper_epsilon(delta) if self.bound > 0 else self._lower_epsilon(delta)

    def _solve(self, target: float) -> float:
        if target <= 0.0:
            return math.inf
        return max(0.0, _epsilon_for(self.pmf, self.offset, self.h, target))

    def _upper_epsilon(self, delta: float) -> float:
        """c is non-increasing in eps: solving with c frozen at a point below the answer
        gives an eps where the charged curve is already <= delta. Where c there is
        already >= the budget (a tilted charge at the top of the support, at tiny
        delta), the budget is split: c(eps) <= f * budget at eps >= c^-1(f * budget)
        (closed form: c is exponential), and (1) <= (1 - f) * budget by the solver."""
        base = delta / (1.0 + self.rel_error) - self.p_inf - self.delta_shift
        below = self._solve(base)  # ignores the charge: <= the answer
        if below == math.inf:
            return math.inf
        charge = float(self.charge(np.array([below]))[0])
        if charge < base:
            eps = self._solve(base - charge)
        elif self.tilt > 0.0:
            eps = min(max((self.log_charge - math.log(f * base)) / self.tilt, self._solve((1.0 - f) * base))
                      for f in (0.5, 0.9, 0.999))
        else:
            return math.inf  # a constant charge >= the budget
        eps = max(eps, self.eps_from, 0.0) + self.loss_error
        step = SOLVER_STEP * max(1.0, eps)
        for _ in range(64):  # the solver's own round-off: step up until the check passes
            if not math.isfinite(eps) or float(self.delta(eps)) <= delta:
                return eps
            eps += step
            step *= 2.0
        return math.inf

    def _lower_epsilon(self, delta: float) -> float:
        """An eps with delta_lo > delta just below it (so the exact eps is >= it)."""
        base = delta * (1.0 + self.rel_error) - self.delta_shift - self.p_inf
        above = self._solve(base)  # ignores the charge: >= the answer
        if above == math.inf:  # the atoms at +inf alone may hold delta: check past the grid
            beyond = (self.offset + self.pmf.size + 1) * self.h + self.loss_error + 1.0
            return math.inf if float(self.delta(beyond)) > delta else 0.0
        eps = 0.0
        for j in range(64):  # c frozen at a guess g <= the solution is >= c on [g, solution]
            guess = above - self.h * 2.0**j
            found = self._solve(base + float(self.charge(np.array([guess]))[0]))
            if found != math.inf and found >= guess:
                eps = found
                break
            if guess <= 0.0:
                break
        eps = max(0.0, eps - self.loss_error)
        step = SOLVER_STEP * max(1.0, eps)
        for _ in range(64):
            probe = math.nextafter(eps, -math.inf)
            if eps <= 0.0 or float(self.delta(probe)) > delta:
                return eps
            eps = max(0.0, eps - step)
            step *= 2.0
        return 0.0


@gated("pmf")
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


@gated("pmf")
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
def _grid_tail_delta(pmf, h):  # pragma: no cover - numba
    """T_j = sum_{k>j} pmf_k (1 - e^{-(k-j) h}) for every j, by the recursion of
    :meth:`DiscretePLD.profile_on_grid` (positive terms only)."""
    n = pmf.shape[0]
    out = np.zeros(n)
    q = math.exp(-h)
    one_minus_q = -math.expm1(-h)
    above = 0.0  # S_j, mass strictly above j
    t = 0.0
    for j in range(n - 1, -1, -1):
        out[j] = t
        above += pmf[j]
        # step to j - 1: T_{j-1} = (1 - q) S_{j-1} + q T_j with S_{j-1} = above
        t = one_minus_q * above + q * t
    return out


@gated("pmf")
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


@gated("pmf")
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
        for i in range(m):  # a loop, not out[:] = ...: slice assignment is slow to compile
            out[i] = -math.inf
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
