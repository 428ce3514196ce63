"""Numba kernels: delta and (alpha, beta) of a finite mixture of subsampled Gaussians.

* :func:`mixture_delta` -- sum_j w_j * delta_subsampled_gauss(eps; mu_j, p);
* :func:`mixture_alpha_beta` -- sum_j w_j * (Phi(-t/mu_j - mu_j/2), Phi(t/mu_j - mu_j/2)).

Same log-space Gaussian probabilities as :mod:`fdp._kernels.chi2`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from fdp._kernels.chi2 import _logaddexp, _logsubexp, _threshold, log_ndtr_pair

__all__ = ["mixture_alpha_beta", "mixture_delta"]


@njit(cache=True)
def _sg_delta(eps, mu, p, remove):  # pragma: no cover - numba
    """delta(eps) of one subsampled-Gaussian step (log space, as gaussian.py)."""
    logp = math.log(p)
    log1mp = math.log1p(-p) if p < 1.0 else -np.inf
    if mu == 0.0:
        return 0.0
    if remove:
        x = _threshold(eps, mu, p, logp, log1mp)
        if x == -np.inf:
            return -math.expm1(eps)  # every outcome has loss > eps: 1 - e^eps Q(all)
        lo0, hi0 = log_ndtr_pair(x)
        lo1, hi1 = log_ndtr_pair(x - mu)
        log_sp = _logaddexp(log1mp + hi0, logp + hi1)
        log_sq = eps + hi0
    else:
        x = _threshold(-eps, mu, p, logp, log1mp)  # L > eps <=> X < x
        if x == -np.inf:
            return 0.0
        lo0, hi0 = log_ndtr_pair(x)
        lo1, hi1 = log_ndtr_pair(x - mu)
        log_sp = lo0
        log_sq = eps + _logaddexp(log1mp + lo0, logp + lo1)
    if log_sq >= log_sp:
        return 0.0
    v = math.exp(_logsubexp(log_sp, log_sq))
    return min(max(v, 0.0), 1.0)


@njit(cache=True, parallel=True)
def mixture_delta(eps, mus, ws, p, remove):  # pragma: no cover - numba
    """sum_j ws[j] * delta_subsampled_gauss(eps[i]; mus[j], p) for every i.

    A component with mu = inf is the singular pair: remove -> P-mass p at +inf
    and 1-p at log(1-p), delta = p + ((1-p) - e^eps)_+; add -> all P-mass at
    -log(1-p), delta = (1 - (1-p) e^eps)_+ (1 at p = 1).
    """
    out = np.zeros(eps.shape[0])
    for i in prange(eps.shape[0]):
        e = eps[i]
        s = 0.0
        for j in range(mus.shape[0]):
            mu = mus[j]
            if mu == np.inf:
                if remove:
                    d = p + max(0.0, (1.0 - p) - math.exp(e))
                else:
                    d = max(0.0, -math.expm1(e + math.log1p(-p))) if p < 1.0 else 1.0
            else:
                d = _sg_delta(e, mu, p, remove)
            s += ws[j] * d
        out[i] = min(s, 1.0)
    return out


@njit(cache=True, parallel=True)
def mixture_alpha_beta(t, mus, ws):  # pragma: no cover - numba
    """alpha_i = sum_j w_j Phi(-t_i/mu_j - mu_j/2), beta_i = sum_j w_j Phi(t_i/mu_j - mu_j/2).

    The seed's Lemma "privacy_curve_knownmean_Gaussian" with Z/sigma = mu. Sums
    run from the smallest terms up (components are ordered by the caller).
    """
    alpha = np.zeros(t.shape[0])
    beta = np.zeros(t.shape[0])
    for i in prange(t.shape[0]):
        ti = t[i]
        sa = 0.0
        sb = 0.0
        for j in range(mus.shape[0]):
            mu = mus[j]
            if mu <= 0.0:
                # mu -> 0: Phi(-t/mu) -> 1{t < 0} (+1/2 at t = 0)
                va = 1.0 if ti < 0.0 else (0.5 if ti == 0.0 else 0.0)
                vb = 1.0 if ti > 0.0 else (0.5 if ti == 0.0 else 0.0)
            else:
                lo, _ = log_ndtr_pair(-ti / mu - 0.5 * mu)
                va = math.exp(lo)
                lo, _ = log_ndtr_pair(ti / mu - 0.5 * mu)
                vb = math.exp(lo)
            sa += ws[j] * va
            sb += ws[j] * vb
        alpha[i] = sa
        beta[i] = sb
    return alpha, beta
