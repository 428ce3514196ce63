"""Randomized response inside random allocation: one epoch's privacy loss, atom by atom.

Each of the t steps reports one bit by randomized response with parameter eps0
(:class:`fdp.RandomizedResponse`: P0 = Bernoulli(a), P1 = Bernoulli(1 - a), a = 1 / (1 + e^eps0)),
and the example is allocated to one uniformly random step. The epoch's pair (remove:
P = mean over j of the laws with step j from P1, Q = all steps from P0) has the
likelihood ratio

    L(b) = (1/t) sum_j rho(b_j),   rho(1) = e^eps0, rho(0) = e^-eps0,

a function of the number n of ones only, which is Binomial(t, a) under Q:

    L_n = (n e^eps0 + (t - n) e^-eps0) / t,
    Q_n = C(t, n) a^n (1 - a)^(t - n),   n = 0, ..., t.                    (1)

So the remove direction's loss is log L_n with P-mass L_n Q_n, and the add direction's
(the pair swapped) is -log L_n with P-mass Q_n: t + 1 atoms, exact up to floating point,
whose error is bounded below and charged (``mass_error``, ``loss_error`` of the cells).
"""

from __future__ import annotations

import math

import numpy as np

from fdp.pld.cells import Direction
from fdp.pld.roundoff import U

__all__ = ["randomized_response_epoch"]


def _log_binomial_masses(epsilon: float, steps: int) -> tuple[np.ndarray, float]:
    """(log Q_n of (1), n = 0..t; a bound on the absolute error of every entry).

    log C(t, n) is the running sum of d_m = log((t - m) / (m + 1)), m < n (each term errs
    by at most u |d_m| + 2u: a rounded quotient and a faithful log), summed in blocks of
    b = ceil(sqrt(t)) (running sums inside each block, then of the block totals): every
    entry takes at most 2b + 1 roundings, each at most u times a partial sum, itself at
    most M = sum |d_m|. Then log(a^n (1 - a)^(t - n)) = -n eps0 - t log1p(e^-eps0) adds a
    few u of its magnitude. The bound returned doubles the total.
    """
    t = steps
    m = np.arange(t, dtype=np.float64)
    terms = np.log((t - m) / (m + 1.0))
    block = max(1, math.isqrt(t - 1) + 1)
    padded = np.zeros(-(-t // block) * block)
    padded[:t] = terms
    rows = np.cumsum(padded.reshape(-1, block), axis=1)
    offsets = np.concatenate(([0.0], np.cumsum(rows[:-1, -1])))
    log_comb = np.concatenate(([0.0], (rows + offsets[:, None]).ravel()[:t]))
    n = np.arange(t + 1, dtype=np.float64)
    base = t * math.log1p(math.exp(-epsilon))
    log_q = log_comb - n * epsilon - base
    total = float(np.sum(np.abs(terms)))
    error = U * (total + 2 * t + (2 * block + 1) * total
                 + 4 * (t * epsilon + base + t + float(np.max(np.abs(log_q)))))
    return log_q, 2.0 * error


def randomized_response_epoch(epsilon: float, steps: int,
                              direction: Direction) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(losses, P-masses, mass_error, loss_error) of one epoch of (1) in ``direction``.

    ``mass_error`` bounds the relative error of every mass, ``loss_error`` the absolute
    error of every loss (:func:`fdp.mechanisms._atoms.atom_cells` charges both).
    """
    t = steps
    log_q, q_error = _log_binomial_masses(epsilon, t)
    n = np.arange(t + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):  # log 0 at n = 0 and n = t: logaddexp keeps the other term
        log_l = np.logaddexp(np.log(n) + epsilon, np.log(t - n) - epsilon) - math.log(t)
    # log L_n: four roundings of values below |log t| + eps0, and logaddexp's own few u
    loss_error = 8 * U * (math.log(t) + epsilon + 1.0)
    if direction is Direction.REMOVE:
        losses, log_mass = log_l, log_l + log_q
    else:
        losses, log_mass = -log_l, log_q
    mass_error = math.expm1(q_error + loss_error + 4 * U) * 2
    return losses, np.exp(log_mass), mass_error, loss_error
