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
forces the window to be cut (``max_points``). Float round-off of the FFT has a
proven bound (:mod:`fdp.pld.roundoff`), charged to both sides the same way, and
exponential tilting (``tilt``) makes it relative to delta where delta is tiny.
The window is chosen so that (2) is below ``tail_mass`` (:mod:`fdp.pld.chernoff`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import scipy.fft
import scipy.special

from fdp._kernels.low_dft import low_frequency_dft
from fdp._kernels.power import complex_power
from fdp.pld.chernoff import composed_window
from fdp.pld.pmf import DiscretePLD
from fdp.pld.roundoff import (U, composition_l2_error, delta_error_weight, direct_dft_error, fft_relative_error,
                              spectrum_error_terms)

__all__ = ["compose", "MAX_FFT_POINTS", "recompute_low_frequencies", "steps_loss_error", "steps_mass_error"]

#: Largest FFT the accountant allocates (2^23 points: ~64 MiB per real array).
MAX_FFT_POINTS = 1 << 23


def compose(
    components: Sequence[tuple[DiscretePLD, int]],
    *,
    pessimistic: bool,
    tail_mass: float = 1e-15,
    max_points: int = MAX_FFT_POINTS,
    tilt: float = 0.0,
) -> DiscretePLD:
    """Compose ``count`` copies of each PLD; all must share the grid spacing h.

    With ``tilt`` = theta > 0 the FFT runs on the exponentially tilted vectors
    q_c(l) = p_c(l) e^{theta l - K_c}, K_c = log sum_l p_c(l) e^{theta l}, whose
    composition is the tilted composition (e^{theta (l_1 + l_2)} = e^{theta l_1}
    e^{theta l_2}); it is untilted afterwards, p_T(s) = q_T(s) e^{L - theta s},
    L = sum_c T_c K_c. Choosing theta so that the tilted law is centred near the eps
    of a query makes the entries that decide delta(eps) O(1) in the FFT, so its
    round-off (absolute, ~ u * max entry) becomes relative to delta: certified
    answers at any delta (docs/accountant.md, "Round-off").

    Args:
      components: (pld, count) pairs, count >= 1.
      pessimistic: charge the wrap-around/round-off mass so that delta is an upper
        bound (True) or a lower bound (False) of the exact composition of the inputs.
      tail_mass: target Chernoff bound on each tail outside the FFT window.
      max_points: refuse (ValueError) windows that need a larger FFT.
      tilt: theta >= 0 (0: no tilting).

    Returns:
      A :class:`DiscretePLD` with ``bound`` = +1 (pessimistic) or -1, whose
      ``delta``/``epsilon`` include every charge (wrap-around, proven round-off).
    """
    components, h = checked_components(components, "compose")
    side = 1 if pessimistic else -1
    if len(components) == 1 and components[0][1] == 1:
        return _single_step(components[0][0], side)  # no FFT, no round-off

    # (1): infinity masses, in log space so that 10^12 steps stay exact
    log_keep = sum(c * math.log1p(-min(pld.p_inf, 1.0)) if pld.p_inf < 1.0 else -math.inf
                   for pld, c in components)
    p_inf = -math.expm1(log_keep) if log_keep > -math.inf else 1.0
    shift = sum(c * pld.delta_shift for pld, c in components)
    steps = sum(c for _, c in components)
    if any(not np.any(pld.pmf > 0.0) for pld, _ in components):
        # a step with no finite mass (all of it at +inf): so has the composition
        return DiscretePLD(h=h, offset=0, pmf=np.zeros(1), p_inf=p_inf, delta_shift=shift, bound=side)

    inputs, log_scale, kappa = _tilted_inputs(components, tilt)
    tail = tail_mass if tilt == 0.0 else _TILTED_TAIL
    t_lo, t_hi, bound_lo, bound_hi = composed_window(inputs, tail, max_points)
    w0 = math.floor(t_lo / h + 1e-9)
    w1 = math.ceil(t_hi / h - 1e-9)
    if w0 > _MAX_WINDOW_INDEX:
        return _beyond_the_grid(h, p_inf, shift, side)
    if w1 < -_MAX_WINDOW_INDEX:
        raise ValueError(f"the composed privacy loss lies below {-_MAX_WINDOW_INDEX * h:.3g} (grid index "
                         f"{w1}), beyond what float64 grid losses hold; use a coarser grid (larger h)")
    needed = w1 - w0 + 1
    if needed > max_points:
        raise ValueError(
            f"the composed privacy loss spans {needed} grid points at spacing h={h:g}, "
            f"more than max_points={max_points}; use a coarser grid (larger h)"
        )
    n_fft = scipy.fft.next_fast_len(needed, real=True)

    spectrum = None
    base = 0
    ratio_sum, log_product, flushed = 0.0, 0.0, False
    for q, count in inputs:
        vector = q.pmf if q.pmf.size <= n_fft else _fold(q.pmf, n_fft)
        kappa = max(kappa, (math.ceil(q.pmf.size / n_fft) - 1) * U * 2)  # folding sums
        f = scipy.fft.rfft(vector, n=n_fft)
        l1_norm = float(vector.sum()) * (1 + vector.size * U)
        direct = recompute_low_frequencies(f, vector, l1_norm, count, n_fft)
        modulus = np.abs(f)
        ratio, log_m = spectrum_error_terms(modulus, l1_norm, count, n_fft, direct)
        ratio_sum, log_product = ratio_sum + ratio, log_product + log_m
        del ratio, log_m
        # coefficients whose T-th power is below e^-700 are set to 0 rather than raised to
        # it (most of them, after many steps); the bound charges them their whole modulus
        flush = modulus < math.exp(_FLUSH_LOG / count)
        flushed = flushed | flush
        f[flush] = 0.0
        del modulus, flush
        if count > 1:
            f = complex_power(f, count)  # repeated squaring, in place
        spectrum = f if spectrum is None else np.multiply(spectrum, f, out=spectrum)
        base += count * q.offset
    full = scipy.fft.irfft(spectrum, n=n_fft)
    start = (w0 - base) % n_fft  # the window starts there (circularly)
    out = full[start:start + needed]
    if out.size < needed:
        out = np.concatenate([out, full[: needed - out.size]])

    # proven l2 error of the computed window (roundoff.py), then entries clipped to
    # [0, 1] (the exact ones lie there, so clipping never moves an entry away)
    l2_error = composition_l2_error(ratio_sum, log_product, steps, len(components), n_fft,
                                    float(np.linalg.norm(full)) * (1 + 4 * U * math.sqrt(n_fft)), flushed)
    del full, spectrum
    # (a tilt so large that the inputs' error bound reaches 1/2 leaves no useful bound: inf)
    rel_in = (math.inf if kappa >= 0.5 else
              math.expm1(steps * (math.log1p(kappa) - math.log1p(-kappa))) if kappa > 0 else 0.0)
    rel_in = (1 + rel_in) * (1 + steps_mass_error(components)) - 1  # the steps' masses' own error
    common = dict(h=h, offset=w0, p_inf=p_inf, bound=side,
                  loss_error=_loss_error(w0, needed, h) + steps_loss_error(components))
    if tilt == 0.0:
        out = np.clip(out, 0.0, 1.0)
        round_off = l2_error * delta_error_weight(0.0, h, needed)
        rel = rel_in + _sum_error(needed)
        if pessimistic:
            charge = bound_lo + bound_hi + round_off
            return DiscretePLD(pmf=out, **{**common, "p_inf": min(1.0, p_inf + charge)},
                               delta_shift=shift, round_off=round_off, rel_error=rel)
        # upper-tail mass wraps to smaller losses (or is dropped): it only lowers delta
        return DiscretePLD(pmf=out, delta_shift=shift - bound_lo - round_off, round_off=round_off,
                           rel_error=rel, **common)

    # untilt in log space: p_T(s) = q_T(s) e^{L - theta s}, clipped to [0, 1]
    losses = (w0 + np.arange(needed, dtype=np.float64)) * h
    with np.errstate(divide="ignore"):
        log_p = np.log(np.maximum(out, 0.0)) + (log_scale - tilt * losses)
    out = np.exp(np.minimum(log_p, 0.0))
    top = float(np.max(np.abs(losses[[0, -1]])))
    # exp's argument is computed with error <= 4u (|L| + theta |s|) (+ theta * loss_error)
    rel_untilt = math.expm1(4 * U * (abs(log_scale) + 2 * tilt * top + 1))
    rel = (1 + rel_in) * (1 + rel_untilt) * (1 + _sum_error(needed)) - 1
    weight = delta_error_weight(tilt, h, needed)
    log_charge = log_scale + math.log(l2_error * weight + bound_lo + bound_hi)
    return DiscretePLD(pmf=out, delta_shift=shift, tilt=tilt, log_charge=log_charge,
                       eps_from=w0 * h, rel_error=rel, **common)


#: Largest grid index of a composed window's start (2^52): beyond it grid losses
#: (offset + k) h are no longer exact float64 products of integers, and Numba's int64
#: offsets overflow soon after (a window at 2.4e19 did, for mu = sqrt(T) / sigma = 2e4).
_MAX_WINDOW_INDEX = 1 << 52


def _beyond_the_grid(h: float, p_inf: float, shift: float, side: int) -> DiscretePLD:
    """The composition when the whole Chernoff window lies above grid index 2^52 (every
    finite composed loss but a charged tail is beyond ~4.5e15 h): the upper bound
    moves all mass to +inf (delta = 1 bounds any delta); the lower bound drops the
    finite mass (delta only decreases). Both keep the bound's side."""
    if side > 0:
        return DiscretePLD(h=h, offset=0, pmf=np.zeros(1), p_inf=1.0, delta_shift=shift, bound=side)
    return DiscretePLD(h=h, offset=0, pmf=np.zeros(1), p_inf=p_inf, delta_shift=shift, bound=side)


#: Tail mass of the tilted law left outside a tilted window (charged, times
#: e^{L - theta eps}, i.e. ~1e-11 of delta).
_TILTED_TAIL = 1e-13


#: log of the smallest T-th power of a coefficient's modulus that is computed (below: 0).
_FLUSH_LOG = -700.0

#: The low frequencies are recomputed directly while their m^T exceeds e^-12 (those with
#: m^T below carry < 1e-5 of the bound), within a budget of multiply-adds per component.
_DIRECT_LOG_CUTOFF = -12.0
_DIRECT_BUDGET = 2_000_000


def recompute_low_frequencies(spectrum: np.ndarray, vector: np.ndarray, l1_norm: float, count: int,
                               n_fft: int, budget: int = 0) -> tuple[int, float]:
    """Overwrite the lowest coefficients of ``spectrum`` (the rfft of ``vector``) with
    direct, more accurate sums where T times the FFT's error would dominate the
    round-off bound, within ``budget`` multiply-adds (0: the default budget). Returns
    (K, e_direct) for :func:`spectrum_error_terms`: the first K coefficients are within
    e_direct each (soundness does not depend on K)."""
    beta = fft_relative_error(n_fft)
    if count * beta < 1e-12:  # the FFT's own error is already negligible after T steps
        return 0, 0.0
    e_fft = beta * (1 + beta) * l1_norm
    with np.errstate(divide="ignore"):
        keep = count * np.log(np.abs(spectrum) + e_fft) >= _DIRECT_LOG_CUTOFF
    below = np.flatnonzero(~keep)
    k = int(below[0]) if below.size else spectrum.size
    k = min(k, max((budget or _DIRECT_BUDGET) // max(vector.size, 1), 1), spectrum.size)
    if k > 0:
        spectrum[:k] = low_frequency_dft(vector, n_fft, k - 1)
    return k, direct_dft_error(l1_norm, vector.size)


def _single_step(pld: DiscretePLD, side: int) -> DiscretePLD:
    """One step needs no FFT: the discretised PLD itself, with its sums' round-off."""
    return dataclasses.replace(pld, bound=side, rel_error=(1 + _sum_error(pld.pmf.size)) * (1 + pld.rel_error) - 1,
                               loss_error=_loss_error(pld.offset, pld.pmf.size, pld.h) + pld.loss_error)


def _tilted_inputs(components, tilt: float):
    """(q_c, T_c) pairs, L = sum_c T_c K_c, and a bound kappa on the relative error of
    each computed q entry (it acts as a relative perturbation of the inputs)."""
    if tilt == 0.0:
        return [(pld, c) for pld, c in components], 0.0, 0.0
    out, log_scale, kappa = [], 0.0, 0.0
    for pld, count in components:
        with np.errstate(divide="ignore"):
            log_w = np.log(pld.pmf) + tilt * pld.losses
        k = float(scipy.special.logsumexp(log_w))
        q = np.exp(log_w - k)
        finite = np.isfinite(log_w)
        size = float(np.max(np.abs(log_w[finite]))) if finite.any() else 0.0
        kappa = max(kappa, 8 * U * (size + abs(k) + 2))
        out.append((DiscretePLD(h=pld.h, offset=pld.offset, pmf=q), count))
        log_scale += count * k
    return out, log_scale, kappa


def checked_components(components: Sequence[tuple[DiscretePLD, int]],
                       caller: str) -> tuple[list[tuple[DiscretePLD, int]], float]:
    """The (pld, count) pairs with count >= 1, and their common grid spacing h."""
    components = [(pld, int(c)) for pld, c in components if int(c) > 0]
    if not components:
        raise ValueError(f"{caller} needs at least one (pld, count) with count >= 1")
    h = components[0][0].h
    if any(not math.isclose(pld.h, h, rel_tol=1e-12) for pld, _ in components):
        raise ValueError("all PLDs must be discretised with the same grid spacing h")
    return components, h


def _sum_error(points: int) -> float:
    """Relative error of the sums of (1) in pmf.py over ``points`` non-negative terms,
    each with its own few-ulp error (Higham, (4.4))."""
    return 4.0 * (points + 4) * U


def steps_mass_error(components: Sequence[tuple[DiscretePLD, int]]) -> float:
    """prod_c (1 + mu_c)^{T_c} - 1: the relative error of every composed entry (a sum of
    products of T step masses, all >= 0) when each step's masses are within mu_c relative
    (its ``rel_error``, :attr:`fdp.pld.cells.LossCells.mass_error`)."""
    return math.expm1(sum(c * math.log1p(pld.rel_error) for pld, c in components) * (1 + 4 * U))


def steps_loss_error(components: Sequence[tuple[DiscretePLD, int]]) -> float:
    """sum_c T_c e_c: how far the composed losses may be from the grid's, each step's
    binned losses being within e_c of its true ones (:attr:`fdp.pld.cells.LossCells.loss_error`)."""
    return sum(c * pld.loss_error for pld, c in components) * (1 + 4 * U)


def _loss_error(offset: int, points: int, h: float) -> float:
    """How far a computed grid loss (offset + k) * h can be from the exact one."""
    return 4.0 * U * h * (abs(offset) + points + 1)


def _fold(pmf: np.ndarray, n: int) -> np.ndarray:
    """pmf (longer than n) folded modulo n: the circular wrap of a support longer than the FFT."""
    pad = (-pmf.size) % n
    return np.concatenate([pmf, np.zeros(pad)]).reshape(-1, n).sum(axis=0)
