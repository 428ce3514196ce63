"""A proven bound on the float64 round-off of FFT composition (docs/accountant.md).

:func:`fdp.pld.compose.compose` convolves vectors q_c >= 0 (each sums to at most 1)
as

    x = IDFT( B ),   B = prod_c DFT(q_c)^{T_c},                                (1)

in floating point (unit round-off u = 2^-53). We bound ||x~ - x||_2, the l2 error
of the computed circular convolution, under the standard error model of the FFT
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 24.1): a
Cooley-Tukey FFT with accurately computed twiddle factors, whose butterflies each
add a relative error <= eta. Then

* componentwise, every output of the forward FFT of a vector v is off by at most
  beta ||v||_1 with beta = C_FFT u log2 n: output k is reached through exactly one
  entry of each sub-transform at each of the log2 n levels, and the entries of
  one level's sub-transforms that feed it have moduli summing to <= ||v||_1;  (2)
* normwise, ||fl(FFT v) - FFT v||_2 <= beta ||FFT v||_2 (Higham, Thm 24.2).   (3)

Higham's radix-2 constant is 4 sqrt 2 + 1 ~ 6.7 (eta = gamma_4 (sqrt 2 + mu)); pocketfft
(scipy.fft) also runs radix-3 and radix-5 passes, each worth log2 3 or log2 5 radix-2
levels with a butterfly error below 2.4x a radix-2 one, so we take C_FFT = 16.
``tests/test_roundoff.py`` checks the bound against exact (rational) convolutions.

Step by step, with e_c = beta (1 + beta) ||q_c||_1 from (2) and m_c,k = |a~_c,k| + e_c
(a bound on both the exact |a_c,k| and the computed |a~_c,k|):

* the lowest coefficients, the only ones with m^T not negligible after many steps, are
  recomputed directly (:func:`fdp._kernels.low_dft.low_frequency_dft`), each within
  e_c,k = :func:`direct_dft_error` ~ 7u ||q_c||_1 instead of beta ||q_c||_1 (272u at
  n = 10^5); the steps below hold with e_c,k in place of e_c;

* power by repeated squaring: |a~^T - a^T| <= T e_c m^(T-1); the squarings and
  products themselves add a relative error <= pi = (1 + 4u)^(2 sum T + C) - 1 (each
  complex product errs by <= 4u, and a squaring doubles the error carried in);
* product over the C components: |B~_k - B_k| <= (sum_c T_c e_c / m_c,k + pi) prod_c m_c,k^T_c;
* a product in the subnormal range errs absolutely, by <= 2^-1074 per rounding: a few
  times 2^-1074 (2 log2 T + C) per coefficient is added (far below everything else);
* inverse, by (3) and Parseval: ||x~ - x||_2 <= beta ||x~||_2 / (1 - beta) + ||B~ - B||_2 / sqrt n.

The sum over k runs over the full (Hermitian) spectrum, in log space. Where |a_c,k| is
well below 1, m^T is tiny: the bound is ~ T beta sqrt(n) ||x||_2 instead of the
normwise T beta sqrt(n) ||q||_2, far smaller after many steps. A bound on the l2 error
becomes one on delta by Cauchy-Schwarz against the weights with which the entries
enter delta (:func:`delta_error_weight`).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["U", "fft_relative_error", "direct_dft_error", "spectrum_error_terms", "composition_l2_error",
           "composition_entry_error", "delta_error_weight"]

#: Unit round-off of float64.
U = 2.0**-53
#: C_FFT of (2): 2.4x Higham's radix-2 constant, for pocketfft's radix-3/5 passes.
C_FFT = 16.0
#: The least positive float64 (2^-1074): an absolute error bound per rounding in the subnormal range.
_TINY = math.ulp(0.0)
#: Largest relative error of one complex product (Brent, Percival, Zimmermann
#: 2007: sqrt(5) u without FMA, 2u with; rounded up).
C_MUL = 4.0


def fft_relative_error(n: int) -> float:
    """beta(n) of (2): the normwise relative error of one float64 FFT of length n."""
    return C_FFT * U * max(math.ceil(math.log2(max(n, 2))), 1)


#: Error of libm's cos and sin, in units of u, charged for a result in [-1, 1] (glibc and
#: Apple's libm document < 1 ulp, i.e. < 2u below 1 in magnitude; charged as 2u).
C_TRIG = 2.0


def direct_dft_error(l1_norm: float, points: int) -> float:
    """Bound on |a~_k - a_k| for a coefficient of :func:`fdp._kernels.low_dft.low_frequency_dft`.

    Each twiddle factor is within e_tw = (C_TRIG + 1) u + 1e-28 of cos/sin(2 pi r / n)
    (the angle is a double-double; one rounding of the correction). The real part sums
    p_j = fl(v_j c~_j): |p_j - v_j c_j| <= v_j (e_tw + u (1 + e_tw)), and the compensated
    sum of N terms is within u |s| + gamma_{N-1}^2 sum |p_j| of s = sum p_j (Ogita, Rump
    and Oishi 2005, Prop. 4.5: Neumaier's loop is their Sum2), |s| <= sum |p_j| <=
    (1 + u)(1 + e_tw) ||v||_1. Likewise the imaginary part; the modulus of the complex
    error is at most sqrt 2 times the larger. Those relative bounds fail where a product
    or a sum is subnormal: each of the 2N roundings then errs by at most 2^-1075
    absolutely, charged as 2N * 2^-1074 per part.
    """
    e_tw = (C_TRIG + 1.0) * U + 1e-28
    gamma = (points * U) / (1.0 - points * U)
    per_part = e_tw + U * (1 + e_tw) + (U + gamma * gamma) * (1 + U) * (1 + e_tw)
    return math.sqrt(2.0) * (per_part * l1_norm + 2 * points * _TINY) * (1 + 1e-6)


def spectrum_error_terms(abs_spectrum: np.ndarray, l1_norm: float, count: int, n: int,
                         direct: tuple[int, float] = (0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """One component's share of the spectral bound: (T e / m, T log m) per coefficient.

    ``abs_spectrum`` is |a~_k| of the computed half spectrum (rfft) of q_c, before the power.
    ``direct`` = (K, e_direct): the first K coefficients were computed directly, each
    within e_direct (:func:`direct_dft_error`); the others by the FFT, within e of (2).
    """
    e = np.full(abs_spectrum.shape, fft_relative_error(n) * (1 + fft_relative_error(n)) * l1_norm)
    e[:direct[0]] = direct[1]
    m = abs_spectrum + e
    with np.errstate(divide="ignore"):
        return count * e / m, count * np.log(m)


def composition_l2_error(ratio_sum: np.ndarray, log_product: np.ndarray, steps: int, factors: int,
                         n: int, result_l2: float, flushed: np.ndarray | bool = False) -> float:
    """Upper bound on ||x~ - x||_2 for the computed convolution (1).

    Args:
      ratio_sum: sum_c T_c e_c / m_c,k over the half spectrum (rfft layout).
      log_product: sum_c T_c log m_c,k over the half spectrum.
      steps: sum_c T_c.
      factors: C, the number of components.
      n: FFT length.
      result_l2: ||x~||_2 of the computed result (before any clipping).
      flushed: where the computed coefficient was set to 0 instead of computed; its
        error is then |B_k| <= prod_c m_c,k^T_c.
    """
    beta = fft_relative_error(n)
    pi = math.expm1((2 * steps + factors) * math.log1p(C_MUL * U))
    # full spectrum: each rfft coefficient but the first (and the Nyquist one) counts twice
    flushed = np.broadcast_to(np.asarray(flushed, dtype=bool), np.shape(log_product))
    live = np.flatnonzero(~flushed)
    log_terms = np.log(np.take(ratio_sum, live) + pi) + np.take(log_product, live)
    # the flushed ones all together: at most (their number) x their largest |B_k|^2
    flushed_count = log_product.size - live.size
    log_flushed = (float(np.max(log_product, where=flushed, initial=-math.inf)) + 0.5 * math.log(flushed_count)
                   if flushed_count else -math.inf)
    top = max(float(np.max(log_terms, initial=-math.inf)), log_flushed)
    if not math.isfinite(top):
        spectral = 0.0 if top == -math.inf else math.inf
    else:
        once = (live == 0) | ((live == log_product.size - 1) & (n % 2 == 0))
        weights = np.where(once, 1.0, 2.0)
        total = float(np.sum(weights * np.exp(2.0 * (log_terms - top)))) + 2.0 * math.exp(2.0 * (log_flushed - top))
        spectral = math.exp(top) * math.sqrt(total)
    # a product (of the squarings, or across components) that falls into the subnormal range
    # errs absolutely, by <= 2^-1074 per real rounding: ~4 per complex product, at most
    # 2 log2(T) + 2 products per component and C - 1 across them, per coefficient
    # (doubled: the later products, of moduli <= 1 + e, carry such an error on at most ~unchanged)
    underflow = 8.0 * _TINY * (factors * (2.0 * math.log2(max(steps, 2)) + 2.0) + factors)
    bound = beta * result_l2 / (1 - beta) + spectral / math.sqrt(n) + underflow
    return bound * (1 + 1e-6)  # the few roundings of this very computation


def composition_entry_error(ratio_sum: np.ndarray, log_product: np.ndarray, steps: int, factors: int,
                            n: int, result_l2: float, flushed: np.ndarray | bool = False) -> float:
    """Upper bound on max_m |x~_m - x_m| for the computed convolution (1): arguments as
    :func:`composition_l2_error`.

    The spectrum's error reaches every entry through the inverse DFT, x_m = (1/n)
    sum_k B_k w^{km}, so by at most (1/n) ||B~ - B||_1 (the l1 norm of the same
    per-coefficient bounds); the inverse FFT's own rounding by at most its l2 bound.
    When the spectrum's error sits in a few low frequencies (a power of many steps),
    this is ~sqrt(K / n) of the l2 bound.
    """
    beta = fft_relative_error(n)
    pi = math.expm1((2 * steps + factors) * math.log1p(C_MUL * U))
    flushed = np.broadcast_to(np.asarray(flushed, dtype=bool), np.shape(log_product))
    once = np.zeros(np.shape(log_product), dtype=bool)
    once[0] = True
    if n % 2 == 0:
        once[-1] = True
    weights = np.where(once, 1.0, 2.0)
    with np.errstate(over="ignore", divide="ignore"):
        terms = np.where(flushed, np.exp(log_product), (ratio_sum + pi) * np.exp(log_product))
    spectral = float(np.sum(weights * terms))
    underflow = 8.0 * _TINY * (factors * (2.0 * math.log2(max(steps, 2)) + 2.0) + factors)
    bound = beta * result_l2 / (1 - beta) + spectral / n + underflow
    return bound * (1 + 1e-6)


def delta_error_weight(tilt: float, h: float, points: int) -> float:
    """sup over eps of ||w||_2 with w_s = e^{-tilt (s - max(eps, s_0))} on the grid points s > eps.

    An entry error e_s of the tilted composition moves delta(eps) by at most
    e^{L - tilt s} |e_s| (the untilting factor), so the total error is at most
    e^{L - tilt max(eps, s_0)} ||e||_2 ||w||_2 (Cauchy-Schwarz); ||w||_2^2 is a
    geometric series bounded by 1 / (1 - e^{-2 tilt h}), and by the number of points.
    """
    if tilt <= 0.0:
        return math.sqrt(points)
    return min(math.sqrt(points), 1.0 / math.sqrt(-math.expm1(-2.0 * tilt * h)))
