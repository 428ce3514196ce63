"""The FFT machinery of random allocation's lattices: circular convolution powers of a
term's class law, with proven bounds on what they get wrong.

A sum of n iid classes M = g_1 + ... + g_n (and sums where some terms have another law)
is computed as the inverse DFT of a product of powers of DFTs (:func:`power_product`),
on a window [lo, lo + n) that holds all but WRAP_TAIL of it on each side (:class:`Chernoff`,
:func:`fft_window`). Three errors are bounded and charged by the callers
(:func:`fdp.mechanisms.allocation_lattice.term_sums`,
:func:`fdp.mechanisms.allocation_class_sum.selected_sums`):

* the FFT's round-off, on every entry (:mod:`fdp.pld.roundoff`);
* the mass outside the window that wraps around onto it (:func:`wrap_envelope`);
* after an exponential tilt (:func:`tilt_exponent`), both as the tilt weighs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.fft

from fdp._kernels.power import complex_power
from fdp.mechanisms.allocation_terms import TermLaw
from fdp.pld.compose import recompute_low_frequencies
from fdp.pld.roundoff import U, composition_entry_error, composition_l2_error, spectrum_error_terms

__all__ = ["Chernoff", "FftWindow", "Spectrum", "block_log_mgf", "fft_window", "folded", "power_product",
           "spectrum", "tilt_exponent", "tilted", "wrap_envelope", "MAX_LATTICE_POINTS", "WRAP_TAIL"]

#: Largest lattice (FFT length) built: ~8.4e6 points, ~0.5 GiB of work arrays.
MAX_LATTICE_POINTS = 2**23
#: Q- and P-mass of one epoch left outside the FFT window on each side (it wraps around;
#: each entry is charged the Chernoff envelope of the tail that lands on it).
WRAP_TAIL = 1e-14
#: Multiply-adds spent on recomputing the low frequencies of a term's spectrum directly
#: (each epoch's lattice is built once per mechanism; this is ~0.2 s).
DIRECT_BUDGET = 300_000_000


def block_log_mgf(weights: np.ndarray, theta: float) -> float:
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
class Chernoff:
    """log E[e^{theta M}] upper bounds on a grid of theta > 0 and theta < 0, under Q (t
    terms with the law a) and under P (k = ``selected`` terms with P1's law, bounded by
    :meth:`TermLaw.p1_upper`, and t - k with a), the larger of the two."""

    theta: np.ndarray  # > 0
    log_up: np.ndarray  # at +theta
    log_down: np.ndarray  # at -theta

    @classmethod
    def of(cls, law: TermLaw, steps: int, selected: int = 1) -> "Chernoff":
        a = law.a * (1 + law.a_error)
        a1 = law.p1_upper()
        var = max(float(np.sum(a * np.arange(a.size, dtype=np.float64) ** 2)), 1.0)
        theta = np.geomspace(1e-4, 1e3, 64) / math.sqrt(steps * var)
        up, down = [], []
        for th in theta:
            for sign, out in ((1.0, up), (-1.0, down)):
                log_q = block_log_mgf(a, sign * th)
                log_p1 = block_log_mgf(a1, sign * th)
                out.append(max(steps * log_q, selected * log_p1 + (steps - selected) * log_q))
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


def wrap_envelope(chernoff: Chernoff, lo: int, n: int, size: int, block: int = 256,
                   theta: float = 0.0, top_free: bool = False) -> np.ndarray:
    """Per window entry j (m = lo + j), a bound on the mass that the circular convolution
    of length n adds to it from outside the window: the masses at m + k n (k >= 1) sum to
    at most Q(M >= lo + n + j), those at m - k n to at most Q(M <= lo + j - n). Both bounds
    are monotone in j, so each block of ``block`` entries takes its largest (the first
    entry's upper tail, the last entry's lower tail).

    Tilted by theta (:func:`tilt_exponent`), mass at M' = m + k n reaches entry m weighted
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
class Spectrum:
    """DFT(v) of a term vector, with its lowest coefficients recomputed directly where T
    times the FFT's error would dominate (:func:`fdp.pld.compose.recompute_low_frequencies`)."""

    values: np.ndarray
    l1: float
    direct: tuple[int, float]


def spectrum(vector: np.ndarray, n: int, count: int) -> Spectrum:
    if vector.size > n:  # the circular convolution's own wrap
        vector = np.bincount(np.arange(vector.size) % n, weights=vector, minlength=n)
    l1 = float(np.sum(vector)) * (1 + vector.size * U)
    values = scipy.fft.rfft(vector, n=n)
    direct = recompute_low_frequencies(values, vector, l1, count, n, budget=DIRECT_BUDGET)
    return Spectrum(values, l1, direct)


def power_product(factors: list[tuple[Spectrum, int]], n: int) -> tuple[np.ndarray, float]:
    """IDFT of prod_c DFT(v_c)^{T_c} and a proven bound on the round-off of every entry
    (:mod:`fdp.pld.roundoff`)."""
    ratio_sum: np.ndarray | float = 0.0
    log_product: np.ndarray | float = 0.0
    product = None
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
        product = g if product is None else product * g
        steps += count
    full = scipy.fft.irfft(product, n=n)
    # a bound on every entry: the l1 route (composition_entry_error) is ~sqrt(K / n) of the
    # l2 one when the error sits in K low frequencies; both are proven, take the smaller
    args = (np.asarray(ratio_sum), np.asarray(log_product), steps, len(factors), n,
            float(np.linalg.norm(full)) * (1 + 4 * U * math.sqrt(n)), flushed)
    error = min(composition_l2_error(*args), composition_entry_error(*args))
    return full, error


#: Largest theta n of the tilt (e^{theta m} stays far below the float range for m < n).
MAX_TILT_SPAN = 600.0
#: The FFT window of a tilted convolution is this much longer than the Chernoff window:
#: the mass beyond it that wraps around arrives weighted e^{theta n}, and the extra
#: length is what lets theta > 0 keep that below WRAP_TAIL.
TILT_PAD = 0.5


def tilt_exponent(law: TermLaw, terms: int, lo: int, n: int, chernoff: "Chernoff", top_free: bool = False) -> float:
    """theta of the exponential tilt of :func:`fdp.mechanisms.allocation_lattice.term_sums`' convolutions.

    The FFT's round-off bound is the same on every entry of the sum's law; the P-masses
    weigh entry m by its likelihood ratio, ~m spacing / t, so over a window of millions of
    classes (small sigma) the charged P-mass reached 1e-6 per epoch. Convolving
    a_g e^{theta g} instead (the sum's law times e^{theta m}, exactly) and multiplying
    back by e^{-theta m} makes the bound on entry m e^{-theta m} times the tilted one,
    which grows with the tilted total mass E_Q[e^{theta M}]. theta is the largest with

    * that total at most e^2 (a heavy term law allows little) and theta <= 1 / E_Q[M];
    * the tilted wrap-around from above at most WRAP_TAIL: for some Chernoff exponent
      theta' > theta, log E[e^{theta' M}] - theta' (lo + n) + theta n <= log WRAP_TAIL
      (:meth:`Chernoff.above_tilted` at the window's first entry, its largest), unless
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
    if terms * block_log_mgf(law.a, hi_t) > 2.0:
        for _ in range(40):
            mid = 0.5 * (lo_t + hi_t)
            lo_t, hi_t = (mid, hi_t) if terms * block_log_mgf(law.a, mid) <= 2.0 else (lo_t, mid)
        hi_t = lo_t
    return hi_t


def tilted(vector: np.ndarray, theta: float) -> np.ndarray:
    if theta == 0.0:
        return vector
    return vector * np.exp(theta * np.arange(vector.size, dtype=np.float64))


def folded(vector: np.ndarray, n: int) -> np.ndarray:
    if vector.size > n:
        return np.bincount(np.arange(vector.size) % n, weights=vector, minlength=n)
    return np.concatenate([vector, np.zeros(n - vector.size)])


@dataclass(frozen=True, eq=False)
class FftWindow:
    """Where a sum of classes is computed: entries m = lo .. hi - 1 of a circular
    convolution of length n >= hi - lo, its vectors tilted by ``theta``
    (:func:`tilt_exponent`); ``chernoff`` bounds the tails outside [lo, hi), ``top_free``
    says none lies above the window."""

    chernoff: Chernoff
    lo: int
    hi: int
    n: int
    theta: float
    top_free: bool

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def rounding(self) -> float:
        """The tilt's and the untilting factor's rounding (4u relative each), as a factor."""
        return (1 + 4 * U) ** 2 if self.theta > 0 else 1.0

    def untilt(self) -> np.ndarray:
        """e^{-theta m} for the window's entries (ones when untilted)."""
        if self.theta == 0:
            return np.ones(self.size)
        return np.exp(-self.theta * np.arange(self.lo, self.hi, dtype=np.float64))

    def entries(self, full: np.ndarray) -> np.ndarray:
        """The window's entries of a circular convolution (still tilted)."""
        return np.roll(full, -(self.lo % self.n))[: self.size]

    def wrapped(self) -> np.ndarray:
        """A bound on the (untilted) mass the circular convolution adds to each entry from
        outside the window, under Q and under P (:func:`wrap_envelope`)."""
        return wrap_envelope(self.chernoff, self.lo, self.n, self.size, theta=self.theta,
                             top_free=self.top_free) * self.rounding


def fft_window(law: TermLaw, terms: int, max_points: int = MAX_LATTICE_POINTS, selected: int = 1) -> FftWindow:
    """The window of a sum of ``terms`` classes of ``law`` (``selected`` of them with P1's
    law under P): the Chernoff window, padded by TILT_PAD where that fits (room for a
    tilt's wrap-around), and the tilt.

    Raises:
      ValueError: the window would exceed ``max_points``.
    """
    chernoff = Chernoff.of(law, terms, selected)
    lo, hi = chernoff.window(WRAP_TAIL)
    n = scipy.fft.next_fast_len(hi - lo, real=True)
    if n > max_points:
        raise ValueError(f"random allocation needs a lattice of {n} points here, more than "
                         f"max_points={max_points}")
    padded = scipy.fft.next_fast_len(int((hi - lo) * (1 + TILT_PAD)) + 1, real=True)
    if terms > 1 and padded <= max_points:  # room for a tilt's wrap-around (see tilt_exponent)
        n = padded
    # nothing wraps in from above when the window reaches past the sum's largest class
    top_free = lo + n > terms * (law.a.size - 1)
    theta = tilt_exponent(law, terms, lo, n, chernoff, top_free) if terms > 1 else 0.0
    return FftWindow(chernoff, lo, hi, n, theta, top_free)
