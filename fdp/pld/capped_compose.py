"""Composition whose partial sums are cut at a query's cap: heavy tails in a window that fits.

A query whose answer is at most b needs the composed PLD only up to the cap
c = b + CAP_MARGIN (:func:`fdp.pld.plan.query_cap`). :func:`fdp.pld.compose.compose`
raises each step's spectrum to its count, so its window must hold the composed loss up
to a Chernoff bound; for heavy tails (the JL mechanism at r <= 3) that window lies far
above the cap — T steps cut at c still sum to T c — and may not fit in ``max_points``,
and then its upper bound is lost. Here the steps are composed by repeated squaring with
*linear* convolutions (an FFT at least as long as the support: nothing wraps around),
and after every convolution the mass of the partial sum above the cap is moved

    upper bound: to +inf (its loss only increases: the partial composition is a pair of
      its own, moving its loss up gives a dominating pair, and composing with the
      remaining steps keeps it dominating);
    lower bound: onto the grid point at the cap (its loss only decreases).

Either move changes delta(eps) at eps <= b by at most e^-(c - eps) times the mass moved
(the argument of :func:`fdp.pld.plan.query_cap`, with S the steps not in the partial sum).

Round-off. With the atom at +inf as one more entry, a convolution is bilinear in the
extended vectors, so for computed inputs x~, y~ within l1 distance e_x, e_y of the exact
ones the computed output z~ satisfies

    ||z~ - z||_1 <= sqrt(N) r + ||x~||_1 e_y + (||y~||_1 + e_y) e_x,               (1)

r the proven l2 error of the FFT convolution of x~ and y~ (two factors,
:func:`fdp.pld.roundoff.composition_l2_error`) and N the entries kept; clipping to >= 0
does not move an entry away from the exact one (>= 0), moving mass is linear and
l1-contracting, and the few sums and products of the atom at +inf add (N + 8) u of their
size. delta(eps) weighs every entry by (1 - e^{eps - l})_+ or 1, all in [0, 1], so the
final l1 bound is charged on delta as it is: +e for the upper bound, -e for the lower.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.fft

from fdp.pld.chernoff import composed_window
from fdp.pld.compose import _loss_error, _sum_error, checked_components, compose, steps_loss_error, steps_mass_error
from fdp.pld.pmf import DiscretePLD
from fdp.pld.roundoff import U, composition_l2_error, spectrum_error_terms

__all__ = ["compose_capped", "compose_for_query"]


@dataclass(frozen=True)
class _Partial:
    """A partial composition: atoms on (offset + k) h, mass p_inf at +inf, and an l1
    bound ``error`` on its distance from the exact (capped) composition."""

    pmf: np.ndarray
    offset: int
    p_inf: float
    error: float

    @property
    def l1(self) -> float:
        """||x~||_1 with the atom at +inf, rounded up."""
        return (float(self.pmf.sum()) + self.p_inf) * (1.0 + (self.pmf.size + 2) * U)


def _convolve(a: _Partial, b: _Partial, top: int, pessimistic: bool, max_points: int) -> _Partial:
    """a (x) b, cut at grid index ``top`` (mass above: to +inf, or onto ``top``), with (1)."""
    x, y = a.pmf, b.pmf
    needed = x.size + y.size - 1
    if needed > max_points:
        raise ValueError(f"a capped composition needs {needed} grid points, more than max_points={max_points}")
    error = a.l1 * b.error + (b.l1 + b.error) * a.error
    if not (x.any() and y.any()):  # one side is all at +inf: no finite mass, exactly
        # (no finite mass has no offset to keep: one empty entry at the cap, not a sum that
        # doubles with every squaring of 1e6 steps)
        return _cut(np.zeros(1), top, _infinite_mass(a, b), error, top, pessimistic)
    n_fft = scipy.fft.next_fast_len(needed, real=True)
    fx = scipy.fft.rfft(x, n=n_fft)
    fy = scipy.fft.rfft(y, n=n_fft)
    rx, lx = spectrum_error_terms(np.abs(fx), float(x.sum()) * (1 + x.size * U), 1, n_fft)
    ry, ly = spectrum_error_terms(np.abs(fy), float(y.sum()) * (1 + y.size * U), 1, n_fft)
    full = scipy.fft.irfft(np.multiply(fx, fy, out=fx), n=n_fft)
    r = composition_l2_error(rx + ry, lx + ly, 2, 2, n_fft,
                             float(np.linalg.norm(full)) * (1 + 4 * U * math.sqrt(n_fft)))
    error += math.sqrt(needed) * r
    return _cut(np.clip(full[:needed], 0.0, None), a.offset + b.offset, _infinite_mass(a, b), error, top,
                pessimistic)


def _infinite_mass(a: _Partial, b: _Partial) -> float:
    """The atom at +inf of a (x) b: a's with all of b, b's with a's finite part (bilinear)."""
    return a.p_inf * (float(b.pmf.sum()) + b.p_inf) + b.p_inf * float(a.pmf.sum())


def _cut(z: np.ndarray, offset: int, p_inf: float, error: float, top: int, pessimistic: bool) -> _Partial:
    """Move the mass above grid index ``top`` to +inf (pessimistic) or onto ``top``; add
    the round-off of the sums and products of the atom at +inf to ``error``."""
    size = z.size
    keep = top - offset + 1  # entries 0 .. top - offset are at or below the cap
    if keep < 1:  # the whole support lies above the cap: all of it moves
        moved = float(z.sum())
        z = np.zeros(1) if pessimistic else np.array([moved])
        p_inf += moved if pessimistic else 0.0
        offset = top
    elif keep < z.size:
        moved = float(z[keep:].sum())
        z = z[:keep].copy()
        if pessimistic:
            p_inf += moved
        else:
            z[-1] += moved
    error += (float(z.sum()) + p_inf) * (size + 8) * U
    return _Partial(pmf=z, offset=offset, p_inf=min(p_inf, 1.0) if pessimistic else p_inf, error=error)


def _power(base: _Partial, count: int, top: int, pessimistic: bool, max_points: int) -> _Partial:
    """base^(x count) by repeated squaring, every product cut at ``top``."""
    result = None
    while count:
        if count & 1:
            result = base if result is None else _convolve(result, base, top, pessimistic, max_points)
        count >>= 1
        if count:
            base = _convolve(base, base, top, pessimistic, max_points)
    assert result is not None
    return result


def compose_capped(components: Sequence[tuple[DiscretePLD, int]], cap: float, *, pessimistic: bool,
                   max_points: int) -> DiscretePLD:
    """The composition of ``count`` copies of each PLD, partial sums cut at ``cap``.

    Args:
      components: (pld, count) pairs, count >= 1; the PLDs exact or one-sided
        discretisations on one grid spacing h (their own charges are not carried).
      cap: loss above which partial sums are moved (to +inf, or onto the cap).
      pessimistic: an upper (True) or lower (False) bound on delta(eps) for eps <= cap.
      max_points: refuse (ValueError) convolutions longer than this.

    Returns:
      A :class:`DiscretePLD` with ``bound`` = +1 or -1 whose ``delta_shift`` is the
      charged round-off (1).
    """
    components, h = checked_components(components, "compose_capped")
    if any(pld.bound != 0 or pld.delta_shift != 0.0 for pld, _ in components):
        raise ValueError("compose_capped composes single-step PLDs without charges")
    top = math.floor(cap / h)
    total = None
    for pld, count in components:
        step = _Partial(pmf=np.asarray(pld.pmf, dtype=np.float64), offset=int(pld.offset), p_inf=float(pld.p_inf),
                        error=0.0)
        powered = _power(step, count, top, pessimistic, max_points)
        total = powered if total is None else _convolve(total, powered, top, pessimistic, max_points)
    assert total is not None
    side = 1 if pessimistic else -1
    common = dict(h=h, offset=total.offset, pmf=total.pmf, bound=side, rel_error=(1 + _sum_error(total.pmf.size)) * (1 + steps_mass_error(components)) - 1,
                  loss_error=_loss_error(total.offset, total.pmf.size, h) + steps_loss_error(components))
    if pessimistic:
        return DiscretePLD(p_inf=min(1.0, total.p_inf), delta_shift=total.error, round_off=total.error, **common)
    return DiscretePLD(p_inf=total.p_inf, delta_shift=-total.error, round_off=total.error, **common)


def compose_for_query(components: Sequence[tuple[DiscretePLD, int]], focus: tuple[float, float] | None,
                      cap: float | None, *, pessimistic: bool, tail_mass: float, max_points: int,
                      tilt: float = 0.0) -> DiscretePLD:
    """:func:`fdp.pld.compose.compose`; for a query (``focus`` = (a, b), ``cap``) whose
    untilted FFT window would be cut to fit ``max_points`` (heavy tails: compose then
    charges the Chernoff bound at the cut), also :func:`compose_capped`, and the tighter
    of the two at b (both are bounds: the choice moves only tightness)."""
    plain = compose(components, pessimistic=pessimistic, tail_mass=tail_mass, max_points=max_points, tilt=tilt)
    if focus is None or cap is None or tilt != 0.0 or sum(c for _, c in components) < 2:
        return plain
    if composed_window(components, tail_mass, max_points)[3] <= tail_mass * (1 + 1e-6):
        return plain  # the window reaches its Chernoff end (up to rounding): nothing to gain
    try:
        capped = compose_capped(components, cap, pessimistic=pessimistic, max_points=max_points)
    except ValueError:  # even the capped support does not fit
        return plain
    at = float(focus[1])
    better = capped.delta(at) < plain.delta(at) if pessimistic else capped.delta(at) > plain.delta(at)
    return capped if better else plain
