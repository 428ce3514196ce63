"""Numba kernels of the chi-square (random-sensitivity) expectation quadrature.

The JL mechanism (:mod:`fdp.mechanisms.jl`) is, given its random sensitivity
Z = z, a Gaussian mechanism with mu = z / sigma. Everything it reports is an
expectation over Z of a subsampled-Gaussian quantity:

* :func:`mixture_cells` -- sum_j w_j * cells(mu_j) on a loss grid (the PLD of a
  discrete mixture), K mixture components times n grid points;
* :mod:`fdp._kernels.chi2_quadrature` -- the mixtures' delta and (alpha, beta).

All Gaussian probabilities are computed as logs from one ``math.erfc`` per
point and shift (log Phi(s) and log Phi(-s) from the same erfc), with the
asymptotic series of Mills' ratio below s = -37 where erfc underflows, so
interval masses of order 1e-300 keep their relative precision. These kernels
do no input checking; the wrappers in :mod:`fdp.mechanisms.jl` do.

Notation: t_k = x(ell_k) is the noise value at which the loss crosses grid
point ell_k (:mod:`fdp.mechanisms.gaussian`, equation (1)); p is the sampling
rate; "lo"/"hi" of a point are log Phi(s) and log Phi(-s).
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

from fdp._kernels.gate import gated

__all__ = ["log_ndtr_pair", "mixture_cells"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_LN2 = math.log(2.0)


@njit(cache=True)
def _log_ndtr_neg(x):  # pragma: no cover - numba
    """log Phi(x) for x <= 0, full relative precision down to x = -1e154."""
    if x == -np.inf:
        return -np.inf
    if x > -37.0:
        return math.log(0.5 * math.erfc(-x * _INV_SQRT2))
    # Phi(x) = phi(x)/|x| * (1 - 1/x^2 + 3/x^4 - 15/x^6 + ...); |term ratio| <= 15/37^2
    z = 1.0 / (x * x)
    s = 1.0
    term = 1.0
    for k in range(1, 10):
        term *= -(2 * k - 1) * z
        s += term
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log(s)


@njit(cache=True)
def log_ndtr_pair(s):  # pragma: no cover - numba
    """(log Phi(s), log Phi(-s)), the smaller one exact, the other by log1p."""
    if s < 0.0:
        lo = _log_ndtr_neg(s)
        return lo, math.log1p(-math.exp(lo))
    hi = _log_ndtr_neg(-s)
    return math.log1p(-math.exp(hi)), hi


@njit(cache=True)
def _log1mexp(d):  # pragma: no cover - numba
    """log(1 - e^d), d <= 0."""
    if d > -_LN2:
        return math.log(-math.expm1(d))
    return math.log1p(-math.exp(d))


@njit(cache=True)
def _logsubexp(a, b):  # pragma: no cover - numba
    """log(e^a - e^b) for a >= b; -inf when equal."""
    if b == -np.inf:
        return a
    if a <= b:
        return -np.inf
    return a + _log1mexp(b - a)


@njit(cache=True)
def _logaddexp(a, b):  # pragma: no cover - numba
    if a == -np.inf:
        return b
    if b == -np.inf:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True)
def _log_interval(a, a_lo, a_hi, b_lo, b_hi):  # pragma: no cover - numba
    """log(Phi(b) - Phi(a)) from the pairs of a and b (same rule as fdp._numerics)."""
    if a > 0.0:
        return _logsubexp(a_hi, b_hi)
    return _logsubexp(b_lo, a_lo)


@njit(cache=True)
def _log_excess(ell, p, log1mp):  # pragma: no cover - numba
    """log(e^ell - (1-p)); -inf where e^ell <= 1 - p."""
    if p == 1.0:
        return ell
    if ell <= log1mp:
        return -np.inf
    return _logsubexp(ell, log1mp)


@njit(cache=True)
def _threshold(ell, mu, p, logp, log1mp):  # pragma: no cover - numba
    """x(ell) = (log((e^ell - (1-p))/p) + mu^2/2) / mu; -inf below log(1-p)."""
    e = _log_excess(ell, p, log1mp)
    if e == -np.inf:
        return -np.inf
    return (e - logp + 0.5 * mu * mu) / mu


@njit(cache=True)
def _remove_loss(x, mu, logp, log1mp):  # pragma: no cover - numba
    return _logaddexp(log1mp, logp + mu * x - 0.5 * mu * mu)


@njit(cache=True)
def _block(offset, h, i, base, eta, w_max, mu, p, remove, logp, log1mp):  # pragma: no cover - numba
    """Cells in the block starting at grid point i (>= 1): width <= eta * max(base, |ell|)
    and <= w_max * e^{d^2 / 8}, d the distance of the noise value at ell_i from the
    nearest mean of P's components (far from them the block holds little mass)."""
    ell = (offset + i) * h
    width = eta * max(base, abs(ell))
    if width > w_max:
        if remove:
            x = _threshold(ell, mu, p, logp, log1mp)
            d = min(abs(x), abs(x - mu)) if p < 1.0 else abs(x - mu)
        else:
            d = abs(_threshold(-ell, mu, p, logp, log1mp))
        if d < 20.0:
            width = min(width, w_max * math.exp(0.125 * d * d))
    width /= h
    return int(min(max(width, 1.0), 1e9))


@njit(cache=True)
def _one_component(offset, h, n, mu, w, p, remove, pessimistic, x_cut, base, eta, w_max,
                   p_cell, u_cell, tails):  # pragma: no cover - numba
    """Add w * cells(mu) into p_cell/u_cell/tails (p_left, d_left, p_right, u_right, p_inf).

    Only grid points whose noise value lies within x_cut of a component's mean
    are evaluated; the (at most 2*Phi(-x_cut)) mass outside them is placed on the
    safe side: pessimistic -> left part at the first evaluated point (loss moved
    up), right part to +inf; optimistic -> left part to ell_0 (loss moved down),
    right part at the last evaluated point (loss moved down).

    Only the ends of blocks of width <= eta * max(base, |ell|) and <= ~w_max
    (:func:`_block`) are evaluated (``base``: the spread of the component's loss).
    Each block [ell_k, ell_{k+s}] of s cells is then known by its exact P-mass and excess
    u = P - e^{ell_k} Q, and is replaced by
      pessimistic: its connect-the-dots split onto the two block ends (P- and
        Q-mass kept; the block is a merge of the split, so the split dominates);
      optimistic: one merged atom at its likelihood ratio
        ell* = ell_k - log(1 - u/P) (a garbling, so it is dominated),
        placed exactly in its cell (P-mass and excess u of the atom),
    both with an error second order in the block width, and no drift: the
    optimistic discretisation of :mod:`fdp.pld.discretise` merges the atoms
    without rounding them. Moving P-mass of the loss up
    (the tails above) can only increase delta(eps) = E_P[(1 - e^{eps-L})_+] of the
    step and of every composition, moving it down only decreases it.
    """
    logp = math.log(p)
    log1mp = math.log1p(-p) if p < 1.0 else -np.inf
    # ---- index range [a, b] of grid points to evaluate
    if remove:
        l_lo = _remove_loss(-x_cut, mu, logp, log1mp)
        l_hi = _remove_loss(mu + x_cut, mu, logp, log1mp)
    else:
        l_lo = -_remove_loss(x_cut, mu, logp, log1mp)
        l_hi = -_remove_loss(-x_cut, mu, logp, log1mp)
    fa = np.floor(l_lo / h) - offset - 1.0
    fb = np.ceil(l_hi / h) - offset + 1.0
    a = int(min(max(fa, 0.0), float(n)))
    b = int(min(max(fb, 0.0), float(n)))
    if b <= a:  # all mass on one side of the evaluated window: widen to one cell
        if a >= n:
            a = n - 1
            b = n
        else:
            b = a + 1
    # block ends: width <= eta * max(base, |ell|) (relative to the loss where it is
    # large, to the component's spread near 0), at least one cell
    m = 1
    i = a
    while i < b:
        i = min(i + _block(offset, h, i, base, eta, w_max, mu, p, remove, logp, log1mp), b)
        m += 1
    idx = np.empty(m, dtype=np.int64)
    i = a
    for c in range(m - 1):
        idx[c] = i
        i = min(i + _block(offset, h, i, base, eta, w_max, mu, p, remove, logp, log1mp), b)
    idx[m - 1] = b
    t = np.empty(m)
    t0lo = np.empty(m)
    t0hi = np.empty(m)
    t1lo = np.empty(m)
    t1hi = np.empty(m)
    for i in range(m):
        ell = (offset + idx[i]) * h
        if remove:
            ti = _threshold(ell, mu, p, logp, log1mp)
        else:
            ti = _threshold(-ell, mu, p, logp, log1mp)
        t[i] = ti
        lo, hi = log_ndtr_pair(ti)
        t0lo[i] = lo
        t0hi[i] = hi
        lo, hi = log_ndtr_pair(ti - mu)
        t1lo[i] = lo
        t1hi[i] = hi
    emh = -math.expm1(-h)  # 1 - e^{-h}
    for i in range(m - 1):
        k = idx[i]
        width = idx[i + 1] - k
        ell = (offset + k) * h
        if remove:
            # x in (t_k, t_{k+1}]; P = (1-p) N(0,1) + p N(mu,1), Q = N(0,1)
            lq = _log_interval(t[i], t0lo[i], t0hi[i], t0lo[i + 1], t0hi[i + 1])
            l1 = _log_interval(t[i] - mu, t1lo[i], t1hi[i], t1lo[i + 1], t1hi[i + 1])
            lpc = _logaddexp(log1mp + lq, logp + l1)
            exc = _log_excess(ell, p, log1mp)
            if exc > -np.inf:
                sub = math.exp(exc + lq) if lq > -np.inf else 0.0
            else:
                sub = -math.exp(math.log(abs(math.expm1(ell) + p)) + lq) if lq > -np.inf else 0.0
            u = math.exp(logp + l1) - sub
        else:
            # x in [t_{k+1}, t_k); P = N(0,1), Q = (1-p) N(0,1) + p N(mu,1)
            lpc = _log_interval(t[i + 1], t0lo[i + 1], t0hi[i + 1], t0lo[i], t0hi[i])
            l1 = _log_interval(t[i + 1] - mu, t1lo[i + 1], t1hi[i + 1], t1lo[i], t1hi[i])
            one_minus = -math.expm1(log1mp + ell) if p < 1.0 else 1.0
            u = math.exp(lpc) * one_minus - math.exp(logp + ell + l1)
        pc = math.exp(lpc)
        if pc <= 0.0:
            continue
        # log Q of the block (Q-mass), for the merged atom's likelihood ratio below
        if remove:
            lqb = lq
        else:
            lqb = _logaddexp(log1mp + lpc, logp + l1) if p < 1.0 else l1
        top = -math.expm1(-width * h)  # largest u/P of the block (all mass at its right end)
        u = min(max(u, 0.0), pc * top)
        if width == 1:
            p_cell[k] += w * pc
            u_cell[k] += w * u
        elif pessimistic:  # connect-the-dots onto the block ends ell_k, ell_{k+width}
            right = min(u / top, pc) if top > 0.0 else pc
            p_cell[k] += w * (pc - right)
            p_cell[k + width - 1] += w * right
            u_cell[k + width - 1] += w * right * emh
        else:  # merged atom at its likelihood ratio ell* = log(P/Q) of the block
            # from the logs, not from u/P: where e^{ell_k} Q << P, u/P rounds to 1 and
            # -log(1 - u/P) would lose ell*. The atom is placed exactly in its cell
            # (p, u), not rounded to a grid point: the merging discretisation then
            # has no drift. ell* is lowered by a margin covering the round-off of
            # the logs (a lower ell* is a garbling of the atom: always safe).
            if lqb > -np.inf:
                rel = lpc - lqb - ell
                rel -= 1e-9 * h + 1e-14 * (abs(lpc) + abs(lqb) + abs(ell))
                j = int(math.floor(rel / h))
                if j < 0:
                    p_cell[k] += w * pc
                elif j >= width:
                    p_cell[k + width - 1] += w * pc
                    u_cell[k + width - 1] += w * pc * emh
                else:
                    p_cell[k + j] += w * pc
                    u_cell[k + j] += w * pc * -math.expm1(j * h - rel)
            else:
                p_cell[k] += w * pc
    # ---- tails of the grid (exact where the window reaches the grid ends)
    j = m - 1
    if remove:
        # P(L <= ell_a) and P(L > ell_b)
        left = (1.0 - p) * math.exp(t0lo[0]) + p * math.exp(t1lo[0])
        right = (1.0 - p) * math.exp(t0hi[j]) + p * math.exp(t1hi[j])
    else:
        # L <= ell_a <=> x >= t_a ; L > ell_b <=> x < t_b
        left = math.exp(t0hi[0])
        right = math.exp(t0lo[j])
    if a == 0:
        if remove:
            ell0 = offset * h
            d = math.expm1(ell0) * math.exp(t0lo[0]) + p * (math.exp(t0lo[0]) - math.exp(t1lo[0]))
        else:
            ell0 = offset * h
            q_left = (1.0 - p) * left + p * math.exp(t1hi[0])
            # no Q-mass: the deficit is -left (<= 0), not inf * 0 = nan; else e^ell0 may
            # overflow to inf, an overstated deficit (the merge then rounds down: safe)
            d = math.exp(ell0) * q_left - left if q_left > 0.0 else -left
        tails[0] += w * left
        tails[1] += w * max(d, 0.0)
    elif left > 0.0:
        if pessimistic:
            p_cell[a] += w * left  # at ell_a: loss moved up
        else:
            tails[0] += w * left  # at ell_0: loss moved down (deficit 0)
    if b == n:
        elln = (offset + n) * h
        if remove:
            exc_n = _log_excess(elln, p, log1mp)
            if exc_n > -np.inf:
                ur = p * math.exp(t1hi[j]) - math.exp(exc_n + t0hi[j])
            else:
                ur = -math.expm1(elln)
        else:
            q_right = (1.0 - p) * right + p * math.exp(t1lo[j])
            # no Q-mass: the excess is all of it, not inf * 0 = nan (a grid top above
            # loss 709); else e^elln may overflow, an understated excess (safe: rounded down)
            ur = right - math.exp(elln) * q_right if q_right > 0.0 else right
        tails[2] += w * right
        tails[3] += w * max(ur, 0.0)
    elif right > 0.0:
        if pessimistic:
            tails[4] += w * right  # to +inf
        else:
            p_cell[b - 1] += w * right  # at ell_b (right end of cell b-1): loss moved down
            u_cell[b - 1] += w * right * emh


@gated("jl")
@njit(cache=True, nogil=True)
def _mixture_chunk(offset, h, n, mus, ws, bases, eta, w_max, p, remove, pessimistic, x_cut, first, stride,
                   acc_p, acc_u, acc_t):  # pragma: no cover - numba
    """Components first, first + stride, ... of :func:`mixture_cells`, added into the accumulators."""
    for j in range(first, mus.shape[0], stride):
        if ws[j] > 0.0:
            _one_component(offset, h, n, mus[j], ws[j], p, remove, pessimistic, x_cut, bases[j], eta, w_max,
                           acc_p, acc_u, acc_t)


def mixture_cells(offset, h, n, mus, ws, bases, eta, w_max, p, remove, pessimistic, x_cut):
    """sum_j ws[j] * cells(mus[j]) on the grid (offset + k) h, k = 0..n.

    Component j is evaluated on blocks of width <= eta * max(bases[j], |ell|) and
    <= ~w_max (see :func:`_one_component`).

    Returns (p_cell, u_cell, tails) with tails = (p_left, d_left, p_right,
    u_right, p_inf). The components are dealt out to threads (Numba releases the
    GIL), each with its own accumulator, then summed: no races. (Threads rather
    than ``prange``: a parallel Numba kernel takes seconds longer to compile, which
    a first query on a fresh install pays.)
    """
    chunks = max(1, min(numba.get_num_threads(), mus.shape[0], 8))
    acc_p = np.zeros((chunks, n))
    acc_u = np.zeros((chunks, n))
    acc_t = np.zeros((chunks, 5))
    args = (np.int64(offset), float(h), np.int64(n), mus, ws, bases, float(eta), float(w_max), float(p),
            bool(remove), bool(pessimistic), float(x_cut))

    def run(c: int) -> None:
        _mixture_chunk(*args, np.int64(c), np.int64(chunks), acc_p[c], acc_u[c], acc_t[c])

    if chunks == 1:
        run(0)
    else:
        list(_pool(chunks).map(run, range(chunks)))
    return acc_p.sum(axis=0), acc_u.sum(axis=0), acc_t.sum(axis=0)


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fdp-cells")
