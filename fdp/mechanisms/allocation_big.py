"""One epoch's classes where exactly one term is large: the large term on a log grid.

The lattice of :mod:`fdp.mechanisms.allocation_lattice` spaces a term's likelihood
ratio W linearly, so it ends at a top T0 = K spacing that a budget of classes allows.
A heavy-tailed step (the JL mechanism: Z's tail is polynomial) puts P1-mass far above
T0 that would otherwise be charged at +inf every epoch. Here the events with exactly
one term at or above T0 get classes of their own (the others' sum R on the linear
lattice, the large term on a logarithmic one):

    class (k, c):  W_i in [v_k, v_{k+1}) for one i, the other t - 1 terms below T0 with
                   M' = sum of their classes in chunk c = [m_c, m_c'],

    Q(k, c)                   = t A_k Q'(c),           A_k = Q(W in [v_k, v_{k+1})),
    E_Q[S - S_lo ; (k, c)]    = t (B_k Q'(c) + A_k sum_{m in c} ((m - m_c) spacing q'_m + rho'_m)),
    E_Q[S_hi - S ; (k, c)]    = t (Bbar_k Q'(c) + A_k sum_{m in c} ((m_c' - m) spacing q'_m + rhobar'_m)),

with S_lo = v_k + m_c spacing, S_hi = v_{k+1} + (m_c' + t - 1) spacing (each within
its xi), q', rho', rhobar' the (t-1)-fold sums of the small classes
(:func:`fdp.mechanisms.allocation_lattice.term_sums`), B_k, Bbar_k the large class's
remainders. Events of different i are disjoint, hence the factor t. The classes are a
post-processing of the output like the lattice's own, so they join its classes for
both splits (:func:`fdp.mechanisms.allocation_lattice.pessimistic_atoms`); two or more
large terms stay in the class C_* (+inf on the upper side; their P-mass is at most
P1(W >= T0) (t-1) Q(W >= T0) + C(t-1, 2) Q(W >= T0)^2, which the plan bounds).

A chunk c of m is at most CHUNK_WIDTH of the large class's v_k wide (in units of S), so
a class's ratio range is within ~(BIG_WIDTH + CHUNK_WIDTH) relative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fdp._kernels.remainder import class_remainders
from fdp.mechanisms.allocation_lattice import EpochLattice, TermSums
from fdp.mechanisms.allocation_terms import _RULES, NDTR_ERROR, RULE_TOLERANCE, Y_CUT, _cell_masses
from fdp.pld.roundoff import U

__all__ = ["BIG_WIDTH", "BigLaw", "big_classes", "mixture_big_law"]

#: Relative width (in W, a log grid) of a large term's class.
BIG_WIDTH = 1 / 512
#: Width of a chunk of the rest's sum, relative to the large term's class edge.
CHUNK_WIDTH = 1 / 512


@dataclass(frozen=True, eq=False)
class BigLaw:
    """A large term's classes W in [e^{log_edges[k]}, e^{log_edges[k+1]}) under Q: ``a`` their
    Q-masses (exact up to the relative ``a_error`` for a partition within ``xi``),
    ``b_lo`` <= E_Q[W - v_k (1 - xi) ; k], ``bbar_lo`` <= E_Q[v_{k+1} (1 + xi) - W ; k]."""

    log_edges: np.ndarray
    xi: float
    a: np.ndarray
    b_lo: np.ndarray
    bbar_lo: np.ndarray
    a_error: float


def _gaussian_big(mu: float, log_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(a, b, bbar, xi) of W = exp(mu Y - mu^2/2) on the classes of ``log_edges``, as
    :func:`fdp.mechanisms.allocation_terms.gaussian_term_law` computes its classes. The
    first edge is moved up by ``gap`` in Y, past every threshold the linear lattice's top
    class may have had (its masses were computed apart): the outputs in between belong
    to no class (C_*), none to two."""
    classes = log_edges.size - 1
    y = (log_edges + 0.5 * mu * mu) / mu
    shift = 2 * 1.26 * NDTR_ERROR
    gap = 2 * shift + 64 * U * (abs(float(y[0])) + 1.0)
    y = y.copy()
    y[0] += gap
    moved = shift + gap  # how far a threshold y'_k may be from the edge y_k the class names
    top_log = float(np.max(np.abs(log_edges)))
    xi = math.expm1(mu * moved + 16 * U * (top_log + mu * mu + 1.0))
    k_lo = max(0, int(np.searchsorted(y, -Y_CUT, side="right")) - 1)
    k_hi = min(classes, int(np.searchsorted(y, Y_CUT + mu, side="left")) + 1)
    a = np.zeros(classes)
    b = np.zeros(classes)
    bbar = np.zeros(classes)
    if k_hi <= k_lo:
        return a, b, bbar, xi
    edges = y[k_lo:k_hi + 1]
    a[k_lo:k_hi] = _cell_masses(edges)
    w = np.exp(log_edges[k_lo:k_hi + 1])
    nodes, weights, log_c = _RULES
    b[k_lo:k_hi], bbar[k_lo:k_hi] = class_remainders(
        np.ascontiguousarray(edges[:-1]), np.ascontiguousarray(edges[1:]), w[:-1], w[1:],
        np.ascontiguousarray(a[k_lo:k_hi]), float(mu), xi, moved, nodes, weights, log_c, RULE_TOLERANCE)
    return a, b, bbar, xi


def mixture_big_law(mus: np.ndarray, weights: np.ndarray, log_edges: np.ndarray) -> BigLaw:
    """:class:`BigLaw` of a finite mixture (as :func:`~fdp.mechanisms.allocation_terms.mixture_term_law`:
    sums of the components' shares, the remainders rounded down). Components mu = 0
    (W = 1) and mu = inf (W = 0 under Q) have no large class (the edges are above 1)."""
    if not log_edges[0] > 0:
        raise ValueError(f"the large classes must start above W = 1; got log W = {log_edges[0]}")
    classes = log_edges.size - 1
    a, b, bbar = np.zeros(classes), np.zeros(classes), np.zeros(classes)
    xi = 16 * U
    n = int(np.sum((mus > 0) & np.isfinite(mus)))
    for mu, w in zip(mus.tolist(), weights.tolist()):
        if w <= 0.0 or mu == 0.0 or mu == math.inf:
            continue
        a_i, b_i, bbar_i, xi_i = _gaussian_big(mu, log_edges)
        a += w * a_i
        b += w * b_i
        bbar += w * bbar_i
        xi = max(xi, xi_i)
    down = 1 - (n + 2) * U
    return BigLaw(log_edges=log_edges, xi=xi, a=a, b_lo=b * down, bbar_lo=bbar * down, a_error=(n + 3) * U)


def big_classes(big: BigLaw, rest: TermSums, steps: int) -> EpochLattice:
    """The classes (k, c) of the module docstring, each a proven bracket: masses from
    lower bounds (rounded down), upper Q-masses rounded up, ratio ranges widened by 4u."""
    t = steps
    spacing, xi = rest.spacing, rest.xi
    v = np.exp(big.log_edges)
    live = np.flatnonzero(big.a > 0)
    octave = np.floor(np.log2(v[live] / v[0])).astype(np.int64)
    parts = []
    for o in np.unique(octave):
        ks = live[octave == o]
        width = max(1, int(min(float(rest.q_lo.size), math.floor(CHUNK_WIDTH * v[ks[0]] / spacing))))
        parts.append(_octave(big, rest, t, ks, width, v))
    if not parts:
        empty = np.zeros(0)
        return EpochLattice(t, empty, empty, empty, empty, empty, empty)
    cat = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    return EpochLattice(t, *cat)


def _octave(big: BigLaw, rest: TermSums, t: int, ks: np.ndarray, width: int,
            v: np.ndarray) -> tuple[np.ndarray, ...]:
    spacing, xi = rest.spacing, rest.xi
    size = rest.q_lo.size
    starts = np.arange(0, size, width)
    ends = np.minimum(starts + width, size)
    lengths = ends - starts
    j = np.arange(size, dtype=np.float64)
    first = np.repeat(starts, lengths).astype(np.float64)
    last = np.repeat(ends - 1, lengths).astype(np.float64)
    down = 1 - (width + 8) * U
    q_lo = np.add.reduceat(rest.q_lo, starts) * down
    q_hi = np.add.reduceat(rest.q_hi, starts) * (1 + (width + 8) * U)
    r_lo = np.add.reduceat((j - first) * spacing * (1 - xi) * rest.q_lo + rest.rho_lo, starts) * down
    r_hi = np.add.reduceat((last - j) * spacing * (1 + xi) * rest.q_lo + rest.rhobar_lo, starts) * down
    m_first = rest.start + starts.astype(np.float64)
    m_last = rest.start + (ends - 1).astype(np.float64)
    e = big.a_error
    a = big.a[ks][:, None]
    out_q_lo = t * a * (1 - e) * q_lo[None, :] * (1 - 4 * U)
    out_q_hi = t * a * (1 + e) * q_hi[None, :] * (1 + 4 * U)
    rho = t * (big.b_lo[ks][:, None] * q_lo[None, :] + a * (1 - e) * r_lo[None, :]) * (1 - 6 * U)
    rhobar = t * (big.bbar_lo[ks][:, None] * q_lo[None, :] + a * (1 - e) * r_hi[None, :]) * (1 - 6 * U)
    x_lo = (v[ks][:, None] * (1 - big.xi) + m_first[None, :] * spacing * (1 - xi)) / t * (1 - 8 * U)
    x_hi = (v[ks + 1][:, None] * (1 + big.xi) + (m_last[None, :] + t - 1) * spacing * (1 + xi)) / t * (1 + 8 * U)
    keep = (out_q_hi > 0).ravel()
    return tuple(np.ravel(arr)[keep] for arr in (x_lo, x_hi, out_q_lo, out_q_hi, rho, rhobar))
