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

from fdp._kernels.power import complex_power
from fdp.mechanisms.allocation_terms import TermLaw
from fdp.pld.cells import Direction
from fdp.pld.compose import recompute_low_frequencies
from fdp.pld.roundoff import U, composition_entry_error, composition_l2_error, spectrum_error_terms

__all__ = ["EpochLattice", "TermSums", "epoch_lattice", "loss_error", "optimistic_atoms", "pessimistic_atoms",
           "MAX_LATTICE_POINTS", "FIRST_CLASS_SPLIT", "first_class_mass", "lattice_points",
           "refine_first_class", "term_sums"]

#: Largest lattice (FFT length) built: ~8.4e6 points, ~0.5 GiB of work arrays.
MAX_LATTICE_POINTS = 2**23
#: P1-mass of a term beyond the top class (charged to +inf on the upper side, dropped
#: on the lower): 1e-11 per epoch is below the FFT round-off charged beside it (~2e-9 at
#: sigma = 1, t = 235), and a smaller one only lengthens the lattice (1e-14: 2x the points).
TAIL = 1e-11
#: Q- and P-mass of one epoch left outside the FFT window on each side (it wraps around;
#: each entry is charged the Chernoff envelope of the tail that lands on it).
WRAP_TAIL = 1e-14
#: Multiply-adds spent on recomputing the low frequencies of a term's spectrum directly
#: (each epoch's lattice is built once per mechanism; this is ~0.2 s).
DIRECT_BUDGET = 300_000_000


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


def _block_log_mgf(weights: np.ndarray, theta: float) -> float:
    """An upper bound on log sum_g weights_g e^{theta g}: blocks of 64 classes, each
    charged at its end where e^{theta g} is largest."""
    pad = (-weights.size) % 64
    blocks = np.concatenate([weights, np.zeros(pad)]).reshape(-1, 64).sum(axis=1) * (1 + 64 * U)
    first = np.arange(blocks.size, dtype=np.float64) * 64
    with np.errstate(divide="ignore"):
        terms = np.log(blocks) + theta * (first + 63 if theta > 0 else first)
    top = float(np.max(terms))
    return top + math.log(float(np.sum(np.exp(terms - top)))) * (1 + 1e-12) + 1e-12 * (1 + abs(top))


@dataclass(frozen=True, eq=False)
class _Chernoff:
    """log E[e^{theta M}] upper bounds on a grid of theta > 0 and theta < 0, under Q (t
    terms with the law a) and under P (one term with P1's law, bounded by
    :meth:`TermLaw.p1_upper`, and t - 1 with a), the larger of the two."""

    theta: np.ndarray  # > 0
    log_up: np.ndarray  # at +theta
    log_down: np.ndarray  # at -theta

    @classmethod
    def of(cls, law: TermLaw, steps: int) -> "_Chernoff":
        a = law.a * (1 + law.a_error)
        a1 = law.p1_upper()
        var = max(float(np.sum(a * np.arange(a.size, dtype=np.float64) ** 2)), 1.0)
        theta = np.geomspace(1e-4, 1e3, 64) / math.sqrt(steps * var)
        up, down = [], []
        for th in theta:
            for sign, out in ((1.0, up), (-1.0, down)):
                log_q = _block_log_mgf(a, sign * th)
                out.append(max(steps * log_q, _block_log_mgf(a1, sign * th) + (steps - 1) * log_q))
        return cls(theta, np.array(up), np.array(down))

    def above(self, s: np.ndarray) -> np.ndarray:
        """Upper bounds on Q(M >= s) and P(M >= s), elementwise."""
        s = np.asarray(s, dtype=np.float64)
        return np.exp(np.min(self.log_up[:, None] - self.theta[:, None] * s[None, :], axis=0).clip(max=0.0))

    def above_tilted(self, s: np.ndarray, theta: float, n: int) -> np.ndarray:
        """Upper bounds on E[e^{theta (M - s + n)} ; M >= s] under Q and P (exponents
        theta' > theta only), elementwise: the wrap-around of a tilted convolution."""
        s = np.asarray(s, dtype=np.float64)
        use = self.theta > theta
        th, up = self.theta[use], self.log_up[use]
        log_bound = np.min(up[:, None] - th[:, None] * s[None, :], axis=0, initial=np.inf) + theta * n
        with np.errstate(over="ignore"):  # a bound beyond the float range is +inf: it zeroes q_lo there
            return np.exp(log_bound)

    def below(self, s: np.ndarray) -> np.ndarray:
        """Upper bounds on Q(M <= s) and P(M <= s), elementwise."""
        s = np.asarray(s, dtype=np.float64)
        return np.exp(np.min(self.log_down[:, None] + self.theta[:, None] * s[None, :], axis=0).clip(max=0.0))

    def window(self, tail: float) -> tuple[int, int]:
        """[lo, hi) with Q- and P-mass <= ``tail`` below lo and at or above hi."""
        hi = float(np.min((self.log_up - math.log(tail)) / self.theta))
        lo = float(np.max((math.log(tail) - self.log_down) / self.theta))
        return max(int(math.floor(lo)), 0), int(math.ceil(hi)) + 1


def _wrap_envelope(chernoff: _Chernoff, lo: int, n: int, size: int, block: int = 256,
                   theta: float = 0.0, top_free: bool = False) -> np.ndarray:
    """Per window entry j (m = lo + j), a bound on the mass that the circular convolution
    of length n adds to it from outside the window: the masses at m + k n (k >= 1) sum to
    at most Q(M >= lo + n + j), those at m - k n to at most Q(M <= lo + j - n). Both bounds
    are monotone in j, so each block of ``block`` entries takes its largest (the first
    entry's upper tail, the last entry's lower tail).

    Tilted by theta (:func:`_tilt`), mass at M' = m + k n reaches entry m weighted
    e^{theta k n}: below (k < 0) at most 1, so the same bound; above, E[e^{theta (M - m)} ;
    M >= s] with s = m + n is at most e^{theta n} E[e^{theta' M}] e^{-theta' s} for every
    theta' >= theta (M - s >= 0 there), the Chernoff bound restricted to those exponents.
    ``top_free``: the window reaches past the sum's largest class, so nothing comes from above."""
    start = np.arange(0, size, block, dtype=np.float64)
    end = np.minimum(start + block - 1, size - 1)
    if top_free:
        above = np.zeros(start.size)
    elif theta == 0.0:
        above = chernoff.above(lo + n + start)
    else:
        above = chernoff.above_tilted(lo + n + start, theta, n)
    per_block = above + chernoff.below(lo + end - n)
    return np.repeat(per_block, block)[:size]


@dataclass(frozen=True, eq=False)
class _Spectrum:
    """DFT(v) of a term vector, with its lowest coefficients recomputed directly where T
    times the FFT's error would dominate (:func:`fdp.pld.compose.recompute_low_frequencies`)."""

    values: np.ndarray
    l1: float
    direct: tuple[int, float]


def _spectrum(vector: np.ndarray, n: int, count: int) -> _Spectrum:
    if vector.size > n:  # the circular convolution's own wrap
        vector = np.bincount(np.arange(vector.size) % n, weights=vector, minlength=n)
    l1 = float(np.sum(vector)) * (1 + vector.size * U)
    values = scipy.fft.rfft(vector, n=n)
    direct = recompute_low_frequencies(values, vector, l1, count, n, budget=DIRECT_BUDGET)
    return _Spectrum(values, l1, direct)


def _power_product(factors: list[tuple[_Spectrum, int]], n: int) -> tuple[np.ndarray, float]:
    """IDFT of prod_c DFT(v_c)^{T_c} and a proven bound on the round-off of every entry
    (:mod:`fdp.pld.roundoff`)."""
    ratio_sum: np.ndarray | float = 0.0
    log_product: np.ndarray | float = 0.0
    spectrum = None
    flushed: np.ndarray | bool = False
    steps = 0
    for spec, count in factors:
        f = spec.values
        modulus = np.abs(f)
        ratio, log_m = spectrum_error_terms(modulus, spec.l1, count, n, spec.direct)
        ratio_sum, log_product = ratio_sum + ratio, log_product + log_m
        flush = modulus < math.exp(-700.0 / count)  # their power underflows: charged whole
        flushed = flushed | flush
        g = np.where(flush, 0.0, f).astype(np.complex128)
        if count > 1:
            g = complex_power(g, count)
        spectrum = g if spectrum is None else spectrum * g
        steps += count
    full = scipy.fft.irfft(spectrum, n=n)
    # a bound on every entry: the l1 route (composition_entry_error) is ~sqrt(K / n) of the
    # l2 one when the error sits in K low frequencies; both are proven, take the smaller
    args = (np.asarray(ratio_sum), np.asarray(log_product), steps, len(factors), n,
            float(np.linalg.norm(full)) * (1 + 4 * U * math.sqrt(n)), flushed)
    error = min(composition_l2_error(*args), composition_entry_error(*args))
    return full, error


def lattice_points(law: TermLaw, steps: int) -> int:
    """The FFT length :func:`epoch_lattice` will use for ``law`` and ``steps``."""
    lo, hi = _Chernoff.of(law, steps).window(WRAP_TAIL)
    return scipy.fft.next_fast_len(hi - lo, real=True)


def term_sums(law: TermLaw, terms: int, max_points: int = MAX_LATTICE_POINTS) -> TermSums:
    """Bounds on the law of the sum of ``terms`` iid classes (:class:`TermSums`).

    Each is a circular convolution computed by FFT on the Chernoff window: the true
    value lies below the computed one plus its round-off bound (an l2 bound, so one on
    every entry), and above it minus that and the mass that wrapped in from outside the
    window (:func:`_wrap_envelope`; rho and rhobar carry <= (n + 1) spacing (1 + xi) per
    unit of it). The classes' Q-masses are exact up to a relative e = ``law.a_error``
    each (2u for one Gaussian), so the n-fold products up to (1 + e)^n. No terms: M = 0.
    """
    n_terms = terms
    if n_terms == 0:
        one = np.ones(1)
        return TermSums(0, law.spacing, law.xi, 0, one, one, np.zeros(1), np.zeros(1))
    chernoff = _Chernoff.of(law, n_terms)
    lo, hi = chernoff.window(WRAP_TAIL)
    n = scipy.fft.next_fast_len(hi - lo, real=True)
    if n > max_points:
        raise ValueError(f"random allocation needs a lattice of {n} points here, more than "
                         f"max_points={max_points}")
    padded = scipy.fft.next_fast_len(int((hi - lo) * (1 + TILT_PAD)) + 1, real=True)
    if n_terms > 1 and padded <= max_points:  # room for a tilt's wrap-around (see _tilt)
        n = padded
    # nothing wraps in from above when the window reaches past the sum's largest class
    top_free = lo + n > n_terms * (law.a.size - 1)
    theta = _tilt(law, n_terms, lo, n, chernoff, top_free) if n_terms > 1 else 0.0
    a, b_lo, bbar_lo = (_tilted(v, theta) for v in (law.a, law.b_lo, law.bbar_lo))
    spectrum_a = _spectrum(a, n, n_terms)
    q_full, q_err = _power_product([(spectrum_a, n_terms)], n)
    if n_terms > 1:
        rho_full, rho_err = _power_product([(_spectrum(b_lo, n, 1), 1), (spectrum_a, n_terms - 1)], n)
        bar_full, bar_err = _power_product([(_spectrum(bbar_lo, n, 1), 1), (spectrum_a, n_terms - 1)], n)
    else:
        rho_full, bar_full = _folded(law.b_lo, n), _folded(law.bbar_lo, n)
        rho_err = bar_err = 0.0
        q_full = _folded(law.a, n)
    shift = lo % n
    # back from the tilted domain: entry m times e^{-theta m} (so is its round-off bound);
    # the tilt and this factor each within 4u relative (exp and a product)
    untilt = np.exp(-theta * np.arange(lo, hi, dtype=np.float64)) if theta > 0 else np.ones(hi - lo)
    rounding = (1 + 4 * U) ** 2 if theta > 0 else 1.0

    def window_of(v: np.ndarray) -> np.ndarray:
        return np.roll(v, -shift)[: hi - lo] * untilt

    q, rho, bar = window_of(q_full), window_of(rho_full), window_of(bar_full)
    q_err, rho_err, bar_err = q_err * untilt * rounding, rho_err * untilt * rounding, bar_err * untilt * rounding
    wrapped = _wrap_envelope(chernoff, lo, n, hi - lo, theta=theta, top_free=top_free) * rounding
    # a product of n_terms vectors is off by their relative errors (law.a_error each; tilted:
    # 4u more each) and, tilted, by the untilting factor's 4u
    tilt_error = (n_terms + 1) * math.log1p(4 * U) if theta > 0 else 0.0
    grow = math.expm1(n_terms * math.log1p(law.a_error) + tilt_error)
    width = (n_terms + 1) * law.spacing * (1 + law.xi)
    q_lo = np.clip((q - q_err - wrapped) * (1 - grow), 0.0, None)
    q_hi = np.clip((q + q_err) * (1 + grow), 0.0, None)
    rho_lo = np.clip((n_terms * (rho - rho_err) - width * wrapped) * (1 - grow), 0.0, None)
    bar_lo = np.clip((n_terms * (bar - bar_err) - width * wrapped) * (1 - grow), 0.0, None)
    return TermSums(n_terms, law.spacing, law.xi, lo, q_lo, q_hi, rho_lo, bar_lo)


#: Largest theta n of the tilt (e^{theta m} stays far below the float range for m < n).
MAX_TILT_SPAN = 600.0
#: The FFT window of a tilted convolution is this much longer than the Chernoff window:
#: the mass beyond it that wraps around arrives weighted e^{theta n}, and the extra
#: length is what lets theta > 0 keep that below WRAP_TAIL.
TILT_PAD = 0.5


def _tilt(law: TermLaw, terms: int, lo: int, n: int, chernoff: "_Chernoff", top_free: bool = False) -> float:
    """theta of the exponential tilt of :func:`term_sums`' convolutions.

    The FFT's round-off bound is the same on every entry of the sum's law; the P-masses
    weigh entry m by its likelihood ratio, ~m spacing / t, so over a window of millions of
    classes (small sigma) the charged P-mass reached 1e-6 per epoch. Convolving
    a_g e^{theta g} instead (the sum's law times e^{theta m}, exactly) and multiplying
    back by e^{-theta m} makes the bound on entry m e^{-theta m} times the tilted one,
    which grows with the tilted total mass E_Q[e^{theta M}]. theta is the largest with

    * that total at most e^2 (a heavy term law allows little) and theta <= 1 / E_Q[M];
    * the tilted wrap-around from above at most WRAP_TAIL: for some Chernoff exponent
      theta' > theta, log E[e^{theta' M}] - theta' (lo + n) + theta n <= log WRAP_TAIL
      (:meth:`_Chernoff.above_tilted` at the window's first entry, its largest), unless
      nothing lies above the window (``top_free``: it reaches the largest class of the sum);
    * theta n <= MAX_TILT_SPAN (every factor in range);

    0 (no tilt) where none is positive. Every theta gives a proven bound; this one gains
    3-14x on long windows but on short linear ones at small t can charge up to a third
    more than none (benchmarks/allocation_charge.py): choosing per lattice is left to do."""
    g = np.arange(law.a.size, dtype=np.float64)
    mean = float(np.sum(law.a * g)) * terms
    room = (math.log(WRAP_TAIL) - chernoff.log_up + chernoff.theta * (lo + n)) / n
    wrap = math.inf if top_free else float(np.max(np.minimum(chernoff.theta * (1 - 1e-9), room)))
    lo_t, hi_t = 0.0, min(1.0 / max(mean, 1.0), MAX_TILT_SPAN / n, wrap)
    if hi_t <= 0.0:
        return 0.0
    if terms * _block_log_mgf(law.a, hi_t) > 2.0:
        for _ in range(40):
            mid = 0.5 * (lo_t + hi_t)
            lo_t, hi_t = (mid, hi_t) if terms * _block_log_mgf(law.a, mid) <= 2.0 else (lo_t, mid)
        hi_t = lo_t
    return hi_t


def _tilted(vector: np.ndarray, theta: float) -> np.ndarray:
    if theta == 0.0:
        return vector
    return vector * np.exp(theta * np.arange(vector.size, dtype=np.float64))


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


def _folded(vector: np.ndarray, n: int) -> np.ndarray:
    if vector.size > n:
        return np.bincount(np.arange(vector.size) % n, weights=vector, minlength=n)
    return np.concatenate([vector, np.zeros(n - vector.size)])


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
