"""One epoch of random allocation, on a lattice of likelihood ratios.

Random allocation (1 of t, "balls in bins"): each example is used in exactly one of
the t steps of an epoch, chosen uniformly. For the Gaussian mechanism (noise
multiplier sigma, mu = 1 / sigma) one epoch is dominated by the pair (Chua et al.,
"Balls-and-Bins Sampling for DP-SGD", AISTATS 2025; Feldman and Shenfeld, "Privacy
amplification by random allocation", arXiv:2502.08202)

    Q = N(0, I_t),    P = (1/t) sum_j N(mu e_j, I_t)       (remove; add is (Q, P))

whose likelihood ratio is a mean of t iid terms under Q:

    dP/dQ (y) = S / t,   S = sum_j W_j,   W_j = exp(mu y_j - mu^2 / 2).           (1)

**The lattice.** Each term is cut into classes g = floor(W / Delta) < K (an
*overflow* class for W >= K Delta). Outside overflow, M = sum_j g_j and
S in [M Delta, (M + t) Delta): the class C_m = {M = m} has likelihood ratios in
[x_lo, x_hi] = [m Delta / t, (m + t) Delta / t]. Its masses are t-fold convolutions
of one term's (:func:`fdp.mechanisms.allocation_lattice.epoch_lattice`, by FFT):

    Q(C_m)                   = q_m = (a^{*t})_m,              a_g = Q(g)
    E_Q[S - m Delta ; C_m]   = rho_m = t (b * a^{*(t-1)})_m,  b_g = E_Q[W - g Delta ; g]
    E_Q[(m+t) Delta - S; C_m] = rhobar_m = t (bbar * a^{*(t-1)})_m,  bbar_g = E_Q[(g+1) Delta - W ; g]
    P(C_m) = E_Q[S/t ; C_m]  = (m Delta q_m + rho_m) / t.

**Two pairs, no estimate.** The classes (and one class C_* for everything else:
an overflow, or M outside the window) are a post-processing of the output, so the
pair of class masses is *dominated* by (P, Q): its delta is a lower bound
(:func:`optimistic_atoms`; C_* is dropped). Splitting every class into two atoms at
x_lo and x_hi that keep its P-mass and Q-mass (Q-mass rho_m / (t Delta) at x_hi,
rhobar_m / (t Delta) at x_lo), and C_*'s P-mass to +inf, gives a pair that
post-processes to (P, Q), so it *dominates*: an upper bound
(:func:`pessimistic_atoms`; the connect-the-dots argument of
:mod:`fdp.pld.discretise` applied to the classes). Every mass enters as a proven
lower bound (FFT round-off by :mod:`fdp.pld.roundoff`, the window's wrap-around by a
Chernoff bound, the terms' own float error), and the mass thereby left out goes to
+inf on the upper side: both sides stay bounds whatever the float arithmetic did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.fft

from fdp.mechanisms.allocation_fft import (MAX_LATTICE_POINTS, WRAP_TAIL, Chernoff, FftWindow, fft_window, folded,
                                           power_product, spectrum, tilted)
from fdp.mechanisms.allocation_terms import TermLaw
from fdp.pld.cells import Direction
from fdp.pld.roundoff import U

__all__ = ["EpochLattice", "TermSums", "epoch_lattice", "loss_error", "optimistic_atoms", "pessimistic_atoms",
           "MAX_LATTICE_POINTS", "FIRST_CLASS_SPLIT", "first_class_mass", "lattice_points",
           "refine_first_class", "term_sums"]

#: P1-mass of a term beyond the top class (charged to +inf on the upper side, dropped
#: on the lower): 1e-11 per epoch is below the FFT round-off charged beside it (~2e-9 at
#: sigma = 1, t = 235), and a smaller one only lengthens the lattice (1e-14: 2x the points).
TAIL = 1e-11


@dataclass(frozen=True, eq=False)
class EpochLattice:
    """Bounds on the classes of one epoch: class k's likelihood ratios S / t lie in
    [``x_lo[k]``, ``x_hi[k]``]; ``q_lo <= Q(C_k) <= q_hi``; ``rho_lo <= E_Q[S - t x_lo ; C_k]``;
    ``rhobar_lo <= E_Q[t x_hi - S ; C_k]`` (t = ``steps``)."""

    steps: int
    x_lo: np.ndarray
    x_hi: np.ndarray
    q_lo: np.ndarray
    q_hi: np.ndarray
    rho_lo: np.ndarray
    rhobar_lo: np.ndarray

    def ratio_range(self) -> tuple[np.ndarray, np.ndarray]:
        """[x_lo, x_hi] of the split: the class's likelihood ratios S / t lie in it."""
        return self.x_lo, self.x_hi

    def joined(self, other: "EpochLattice") -> "EpochLattice":
        """The classes of both (disjoint events of one epoch)."""
        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(self, name), getattr(other, name)])
        return EpochLattice(self.steps, *(cat(f) for f in ("x_lo", "x_hi", "q_lo", "q_hi", "rho_lo", "rhobar_lo")))


@dataclass(frozen=True, eq=False)
class TermSums:
    """Bounds on the law of M = g_1 + ... + g_n, n iid classes of a :class:`TermLaw` (no
    overflow), for m = start .. start + q_lo.size - 1: ``q_lo <= Q(M = m) <= q_hi``;
    ``rho_lo <= E_Q[R - m spacing (1 - xi) ; M = m]``, ``rhobar_lo <= E_Q[(m + n) spacing
    (1 + xi) - R ; M = m]``, R = W_1 + ... + W_n."""

    terms: int
    spacing: float
    xi: float
    start: int
    q_lo: np.ndarray
    q_hi: np.ndarray
    rho_lo: np.ndarray
    rhobar_lo: np.ndarray

    @property
    def m(self) -> np.ndarray:
        return self.start + np.arange(self.q_lo.size, dtype=np.float64)


def lattice_points(law: TermLaw, steps: int) -> int:
    """The FFT length :func:`epoch_lattice` will use for ``law`` and ``steps``."""
    lo, hi = Chernoff.of(law, steps).window(WRAP_TAIL)
    return scipy.fft.next_fast_len(hi - lo, real=True)


def term_sums(law: TermLaw, terms: int, max_points: int = MAX_LATTICE_POINTS,
              window: FftWindow | None = None) -> TermSums:
    """Bounds on the law of the sum of ``terms`` iid classes (:class:`TermSums`).

    Each is a circular convolution computed by FFT on the Chernoff window (``window``:
    :func:`fdp.mechanisms.allocation_fft.fft_window` of ``law`` and ``terms`` unless given):
    the true value lies below the computed one plus its round-off bound (an l2 bound, so
    one on every entry), and above it minus that and the mass that wrapped in from
    outside the window (:func:`fdp.mechanisms.allocation_fft.wrap_envelope`; rho and
    rhobar carry <= (n + 1) spacing (1 + xi) per unit of it). The classes' Q-masses are
    exact up to a relative e = ``law.a_error`` each (2u for one Gaussian), so the n-fold
    products up to (1 + e)^n. No terms: M = 0.
    """
    n_terms = terms
    if n_terms == 0:
        one = np.ones(1)
        return TermSums(0, law.spacing, law.xi, 0, one, one, np.zeros(1), np.zeros(1))
    win = fft_window(law, n_terms, max_points) if window is None else window
    n, theta = win.n, win.theta
    a, b_lo, bbar_lo = (tilted(v, theta) for v in (law.a, law.b_lo, law.bbar_lo))
    spectrum_a = spectrum(a, n, n_terms)
    q_full, q_err = power_product([(spectrum_a, n_terms)], n)
    if n_terms > 1:
        rho_full, rho_err = power_product([(spectrum(b_lo, n, 1), 1), (spectrum_a, n_terms - 1)], n)
        bar_full, bar_err = power_product([(spectrum(bbar_lo, n, 1), 1), (spectrum_a, n_terms - 1)], n)
    else:
        rho_full, bar_full = folded(law.b_lo, n), folded(law.bbar_lo, n)
        rho_err = bar_err = 0.0
        q_full = folded(law.a, n)
    # back from the tilted domain: entry m times e^{-theta m} (so is its round-off bound);
    # the tilt and this factor each within 4u relative (exp and a product)
    untilt = win.untilt()
    q, rho, bar = (win.entries(v) * untilt for v in (q_full, rho_full, bar_full))
    q_err, rho_err, bar_err = (e * untilt * win.rounding for e in (q_err, rho_err, bar_err))
    wrapped = win.wrapped()
    # a product of n_terms vectors is off by their relative errors (law.a_error each; tilted:
    # 4u more each) and, tilted, by the untilting factor's 4u
    tilt_error = (n_terms + 1) * math.log1p(4 * U) if theta > 0 else 0.0
    grow = math.expm1(n_terms * math.log1p(law.a_error) + tilt_error)
    width = (n_terms + 1) * law.spacing * (1 + law.xi)
    q_lo = np.clip((q - q_err - wrapped) * (1 - grow), 0.0, None)
    q_hi = np.clip((q + q_err) * (1 + grow), 0.0, None)
    rho_lo = np.clip((n_terms * (rho - rho_err) - width * wrapped) * (1 - grow), 0.0, None)
    bar_lo = np.clip((n_terms * (bar - bar_err) - width * wrapped) * (1 - grow), 0.0, None)
    return TermSums(n_terms, law.spacing, law.xi, win.lo, q_lo, q_hi, rho_lo, bar_lo)


def epoch_lattice(law: TermLaw, steps: int, max_points: int = MAX_LATTICE_POINTS) -> EpochLattice:
    """The classes C_m = {M = m} of one epoch of ``steps`` terms (module docstring), from
    :func:`term_sums`: S / t in [m spacing (1 - xi) / t, (m + t) spacing (1 + xi) / t]."""
    sums = term_sums(law, steps, max_points)
    t = steps
    x_lo = sums.m * sums.spacing * (1 - sums.xi) / t
    x_hi = (sums.m + t) * sums.spacing * (1 + sums.xi) / t
    return EpochLattice(t, x_lo, x_hi, sums.q_lo, sums.q_hi, sums.rho_lo, sums.rhobar_lo)


#: The class M = 0 (every term below the spacing) is refined on a lattice this many times
#: finer (a power of 2: its top edge is the coarse class's W, moved just below it; see refine_first_class).
FIRST_CLASS_SPLIT = 1024
#: ... where the split would put more Q-mass than this at likelihood ratio 0.
FIRST_CLASS_MASS = 1e-15


def first_class_mass(lattice: EpochLattice) -> float:
    """Q-mass the split puts at likelihood ratio 0: the class M = 0's share at x_lo = 0, a
    loss of +inf in the add direction (at t = 2, sigma = 1: 3e-4 per epoch)."""
    at_zero = lattice.x_lo == 0
    if not np.any(at_zero):
        return 0.0
    width = lattice.x_hi[at_zero] - lattice.x_lo[at_zero]
    return float(np.sum(lattice.rhobar_lo[at_zero] / (lattice.steps * width)))


def refine_first_class(lattice: EpochLattice, finer: EpochLattice) -> EpochLattice:
    """``lattice`` with its class M = 0 replaced by ``finer``'s classes: ``finer`` is the
    epoch lattice of the term law restricted below the spacing Delta, on spacing
    Delta / FIRST_CLASS_SPLIT (classes g' < FIRST_CLASS_SPLIT, the rest its overflow), so
    its classes lie inside the event "every term below Delta" that M = 0 is (its top edge
    moved down past the coarse threshold: ``inside=True`` of the term laws; what falls
    between belongs to no class, none to two), and only its own M' = 0, a far smaller
    event, still touches likelihood ratio 0."""
    keep = lattice.x_lo > 0

    def cut(name: str) -> np.ndarray:
        return getattr(lattice, name)[keep]
    rest = EpochLattice(lattice.steps, *(cut(f) for f in ("x_lo", "x_hi", "q_lo", "q_hi", "rho_lo", "rhobar_lo")))
    return rest.joined(finer)


def pessimistic_atoms(lattice: EpochLattice, direction: Direction) -> tuple[np.ndarray, np.ndarray, float]:
    """(losses, P-masses, p_inf) of the dominating split pair (module docstring).

    Class C_m is split into Q-mass rho_m / (t w) at x_hi and rhobar_m / (t w) at x_lo,
    w = x_hi - x_lo, which keeps its Q-mass and P-mass; the masses are lower bounds
    and what they leave out of the total goes to +inf (P-mass) or to -inf (Q-mass,
    no P-mass): a pair that post-processes to the split pair, so it dominates too.
    Remove: losses log x, P-masses x * Q-mass. Add (the pair swapped): losses -log x,
    P-masses the Q-masses, and the Q-mass left out at +inf.
    """
    x_lo, x_hi = lattice.ratio_range()
    t = lattice.steps
    w = x_hi - x_lo
    q_at_hi = lattice.rho_lo / (t * w) * (1 - 4 * U)
    q_at_lo = lattice.rhobar_lo / (t * w) * (1 - 4 * U)
    with np.errstate(divide="ignore"):
        log_lo, log_hi = np.log(x_lo), np.log(x_hi)
    if direction is Direction.REMOVE:
        masses = np.concatenate([x_lo * q_at_lo, x_hi * q_at_hi]) * (1 - 2 * U)
        losses = np.concatenate([log_lo, log_hi])
    else:
        masses = np.concatenate([q_at_lo, q_at_hi])
        losses = -np.concatenate([log_lo, log_hi])
    kept = (masses > 0) & np.isfinite(losses)  # an atom at x_lo = 0 (add: loss +inf) joins p_inf
    losses, masses = losses[kept], masses[kept]
    p_inf = min(1.0, max(0.0, 1.0 - float(np.sum(masses)) * (1 - masses.size * U)))
    return losses, masses, p_inf


def optimistic_atoms(lattice: EpochLattice, direction: Direction) -> tuple[np.ndarray, np.ndarray]:
    """(losses, P-masses) of the dominated class pair, each a lower bound (C_* dropped).

    Remove: P(C_m) = x_lo Q(C_m) + rho_m / t >= x_lo q_lo + rho_lo / t, at the loss
    log(P(C_m) / Q(C_m)) >= log(x_lo + rho_lo / (t q_hi)). Add (the pair swapped):
    Q-masses q_lo at minus an upper bound of that loss, P(C_m) / Q(C_m) =
    x_hi - rhobar_m / (t Q(C_m)) <= x_hi - rhobar_lo / (t q_hi). The losses' rounding is
    :func:`loss_error`'s.
    """
    x_lo, x_hi = lattice.ratio_range()
    t = lattice.steps
    with np.errstate(divide="ignore", invalid="ignore"):
        if direction is Direction.REMOVE:
            masses = (x_lo * lattice.q_lo + lattice.rho_lo / t) * (1 - 4 * U)
            loss = np.log(x_lo + lattice.rho_lo / (t * lattice.q_hi))
        else:
            masses = lattice.q_lo
            loss = -np.log(x_hi - lattice.rhobar_lo / (t * lattice.q_hi))
    kept = (masses > 0) & np.isfinite(loss)
    return loss[kept], masses[kept]


def loss_error(losses: np.ndarray) -> float:
    """A bound on how far the atoms' computed losses are from the values they stand for:
    a log of a ratio of a few correctly rounded operations (relative error <= 8u), and
    the log's own rounding."""
    top = float(np.max(np.abs(losses), initial=0.0))
    return 16 * U * (1.0 + top)
