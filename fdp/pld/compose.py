"""Composition of discrete PLDs by one FFT, with the wrap-around mass accounted.

Composing independent mechanisms adds their privacy losses, so the composed PLD
is the convolution of the single-step ones; atoms at +inf compose as

    p_inf = 1 - prod_c (1 - p_inf_c)^{T_c}.                                  (1)

The finite parts are convolved in one go: rfft of each (folded onto N points),
raised to its count T_c, multiplied, one irfft. An FFT convolution is circular:
composed mass outside the window [t_lo, t_hi] of N points wraps around and lands
*somewhere* inside it. We bound that mass with a Chernoff bound computed from the
exact moment generating function of the discretised losses,

    P(S >= t) <= exp(sum_c T_c K_c(lam) - lam t),  K_c(lam) = log E[e^{lam L_c}],  (2)
    P(S <= t) <= exp(sum_c T_c K_c(-lam) + lam t),

and charge it: added to +inf for a pessimistic PLD (delta can only grow). For an
optimistic PLD only the lower tail is charged (subtracted from delta): mass above
the window at true loss l lands at l - m N h < l (m >= 1) or in the discarded
padding, and delta(eps) = sum_l (1 - e^(eps - l))_+ P(l) is non-decreasing in
every l, so that mass can only lower delta; mass below the window lands higher,
which could raise it. This keeps the lower bound useful when a heavy upper tail
forces the window to be cut (``max_points``). Float round-off of the FFT is
estimated from the negative entries it produces and charged to both sides the
same way. The window is chosen so that (2) is below ``tail_mass``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.fft

from fdp._kernels.power import complex_power
from fdp.pld.pmf import DiscretePLD

__all__ = ["compose", "composed_window", "MAX_FFT_POINTS"]

#: Largest FFT the accountant allocates (2^23 points: ~64 MiB per real array).
MAX_FFT_POINTS = 1 << 23


def _log_mgf_sum(components: Sequence[tuple[DiscretePLD, int]], lam: np.ndarray) -> np.ndarray:
    """sum_c T_c K_c(lam): the log-MGF of the composed (finite) loss, an upper bound."""
    out = np.zeros_like(lam)
    for pld, count in components:
        out += count * pld.log_mgf(lam)
    return out


def _best_chernoff(components, lam: np.ndarray, log_tau: float, upper: bool) -> tuple[float, float, float]:
    """Over the given lam > 0, the best window end and the lam and log-MGF achieving it.

    Upper tail: t = (K(lam) - log tau) / lam, smallest over lam. Lower tail:
    t = (log tau - K(-lam)) / lam, largest over lam.
    """
    k = _log_mgf_sum(components, lam if upper else -lam)
    with np.errstate(invalid="ignore", over="ignore"):
        t = (k - log_tau) / lam if upper else (log_tau - k) / lam
    t = np.where(np.isfinite(t), t, np.inf if upper else -np.inf)
    i = int(np.argmin(t) if upper else np.argmax(t))
    return float(t[i]), float(lam[i]), float(k[i])


def composed_window(
    components: Sequence[tuple[DiscretePLD, int]], tail_mass: float, max_points: int | None = None
) -> tuple[float, float, float, float]:
    """Loss window [t_lo, t_hi] outside which each tail of the composed PLD is <= tail_mass.

    Returns (t_lo, t_hi, bound_lo, bound_hi) where bound_* are the Chernoff
    bounds (2) on the mass below t_lo / above t_hi actually achieved. If the
    window would need more than ``max_points`` grid points (heavy upper tails),
    its upper end is cut there and bound_hi is the Chernoff bound at the cut:
    larger than tail_mass, but still charged on the safe side by :func:`compose`.
    """
    h = components[0][0].h
    support_lo = sum(c * pld.offset for pld, c in components) * h
    support_hi = sum(c * (pld.offset + pld.pmf.size - 1) for pld, c in components) * h
    var = sum(c * pld.variance() for pld, c in components)
    scale = max(math.sqrt(var), h)
    log_tau = math.log(tail_mass)
    # coarse-to-fine search over lam on a log scale around 1/scale, each tail separately
    coarse = np.logspace(-2, 3.5, 12) / scale
    ends = []
    for upper in (True, False):
        _, lam0, _ = _best_chernoff(components, coarse, log_tau, upper)
        ends.append(_best_chernoff(components, lam0 * np.logspace(-0.25, 0.25, 5), log_tau, upper))
    (t_hi, lam_hi, k_hi), (t_lo, lam_lo, k_lo) = ends
    t_hi = min(t_hi, support_hi)
    t_lo = max(t_lo, support_lo)
    if not (np.isfinite(t_hi) and np.isfinite(t_lo)):
        t_lo, t_hi = support_lo, support_hi
    t_hi = max(t_hi, t_lo + h)
    if max_points is not None and (t_hi - t_lo) / h + 3 > max_points:
        t_hi = t_lo + (max_points - 3) * h
        lam = np.logspace(-2, 3.5, 64) / scale
        with np.errstate(invalid="ignore", over="ignore"):
            excess = _log_mgf_sum(components, lam) - lam * t_hi
        i = int(np.nanargmin(np.where(np.isfinite(excess), excess, np.inf)))
        lam_hi, k_hi = float(lam[i]), float(excess[i] + lam[i] * t_hi)
    # the bounds actually achieved at the (clipped) window ends
    bound_hi = 0.0 if t_hi >= support_hi else float(np.exp(min(0.0, k_hi - lam_hi * t_hi)))
    bound_lo = 0.0 if t_lo <= support_lo else float(np.exp(min(0.0, k_lo + lam_lo * t_lo)))
    return t_lo, t_hi, bound_lo, bound_hi


def compose(
    components: Sequence[tuple[DiscretePLD, int]],
    *,
    pessimistic: bool,
    tail_mass: float = 1e-15,
    max_points: int = MAX_FFT_POINTS,
) -> DiscretePLD:
    """Compose ``count`` copies of each PLD; all must share the grid spacing h.

    Args:
      components: (pld, count) pairs, count >= 1.
      pessimistic: charge the wrap-around/round-off mass so that delta is an upper
        bound (True) or a lower bound (False) of the exact composition of the inputs.
      tail_mass: target Chernoff bound on each tail outside the FFT window.
      max_points: refuse (ValueError) windows that need a larger FFT.
    """
    components = [(pld, int(c)) for pld, c in components if int(c) > 0]
    if not components:
        raise ValueError("compose needs at least one (pld, count) with count >= 1")
    h = components[0][0].h
    if any(not math.isclose(pld.h, h, rel_tol=1e-12) for pld, _ in components):
        raise ValueError("all PLDs must be discretised with the same grid spacing h")

    # (1): infinity masses, in log space so that 10^12 steps stay exact
    log_keep = sum(c * math.log1p(-min(pld.p_inf, 1.0)) if pld.p_inf < 1.0 else -math.inf
                   for pld, c in components)
    p_inf = -math.expm1(log_keep) if log_keep > -math.inf else 1.0
    shift = sum(c * pld.delta_shift for pld, c in components)

    t_lo, t_hi, bound_lo, bound_hi = composed_window(components, tail_mass, max_points)
    w0 = math.floor(t_lo / h + 1e-9)
    w1 = math.ceil(t_hi / h - 1e-9)
    needed = w1 - w0 + 1
    if needed > max_points:
        raise ValueError(
            f"the composed privacy loss spans {needed} grid points at spacing h={h:g}, "
            f"more than max_points={max_points}; use a coarser grid (larger h)"
        )
    n_fft = scipy.fft.next_fast_len(needed, real=True)

    spectrum = None
    base = 0
    for pld, count in components:
        f = scipy.fft.rfft(pld.pmf, n=n_fft) if pld.pmf.size <= n_fft else scipy.fft.rfft(_fold(pld.pmf, n_fft))
        if count > 1:
            f = complex_power(f, count)  # repeated squaring, in place
        spectrum = f if spectrum is None else np.multiply(spectrum, f, out=spectrum)
        base += count * pld.offset
    full = scipy.fft.irfft(spectrum, n=n_fft)
    start = (w0 - base) % n_fft  # the window starts there (circularly)
    out = full[start:start + needed]
    if out.size < needed:
        out = np.concatenate([out, full[: needed - out.size]])

    # round-off: the exact result is >= 0, so negative entries measure the FFT error
    lowest, highest = float(out.min()), float(out.max())
    noise = max(0.0, -lowest, 4.0 * np.finfo(float).eps * max(highest, -lowest))
    out = np.maximum(out, 0.0)  # a compact copy (the FFT buffer is released)
    round_off = noise * needed
    if pessimistic:
        charge = bound_lo + bound_hi + round_off
        return DiscretePLD(h=h, offset=w0, pmf=out, p_inf=min(1.0, p_inf + charge), delta_shift=shift,
                           round_off=round_off)
    # upper-tail mass wraps to smaller losses (or is dropped): it only lowers delta
    charge = bound_lo + round_off
    return DiscretePLD(h=h, offset=w0, pmf=out, p_inf=p_inf, delta_shift=shift - charge, round_off=round_off)


def _fold(pmf: np.ndarray, n: int) -> np.ndarray:
    """pmf (longer than n) folded modulo n: the circular wrap of a support longer than the FFT."""
    pad = (-pmf.size) % n
    return np.concatenate([pmf, np.zeros(pad)]).reshape(-1, n).sum(axis=0)
