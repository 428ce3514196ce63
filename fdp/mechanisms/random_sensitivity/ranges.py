"""Loss ranges of the random-sensitivity Gaussian: tails bounded from the law of Z."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from fdp.mechanisms.random_sensitivity.laws import ZLaw
from fdp.pld.cells import Direction

__all__ = ["MAX_LOSS", "UPPER_TAIL_FACTOR", "loss_range"]

#: Largest |loss| a single step's grid is asked to cover (a float sanity bound; the
#: heavy upper tail beyond the grid goes to +inf in the pessimistic cells).
MAX_LOSS = 1e15
#: The upper end of the grid leaves UPPER_TAIL_FACTOR times the requested tail mass
#: above it (to +inf, pessimistically): P(L > ell) decays only like ell^(-r/2), and the
#: accountant's per-step budget (1e-4 delta / T) would push a uniform grid to losses of
#: 1e12 at r = 1-3; 1000x that budget (0.1 delta over all steps) keeps the range where
#: the answer is, for a bound that is looser by at most 0.1 delta in delta.
UPPER_TAIL_FACTOR = 1e3


def loss_range(law: ZLaw, sigma: float, p: float, direction: Direction,
                tail_mass: float) -> tuple[float, float]:
    """(lo, hi) with P(L < lo) <= tail_mass and P(hi < L < inf) <= tail_mass, capped at MAX_LOSS.

    Remove direction, ell > 0, A = log((e^ell - (1-p))/p): given mu,
        P(L > ell | mu) = (1-p) Phibar(A/mu + mu/2) + p Phibar(A/mu - mu/2),
    A/mu + mu/2 >= sqrt(2A) (AM-GM) and A/mu - mu/2 is decreasing in mu, so for any mu*
        P(L > ell) <= (1-p) Phibar(sqrt(2A)) + p [P(Z/sigma > mu*) + Phibar(A/mu* - mu*/2)].
    Each term is made <= tail_mass/3. The add direction's lower tail obeys the
    first bound (P(L < -ell) <= Phibar(sqrt(2A))); its upper end is -log(1-p). At
    p = 1 both directions have the remove direction's law, L = mu^2/2 + mu xi given mu
    (xi ~ N(0, 1)), and for every mu and ell >= 0 (AM-GM again)
        P(L < -ell | mu) = Phi(-(ell/mu + mu/2)) <= Phi(-sqrt(2 ell)),
    so lo = -z^2/2 with Phi(-z) = tail_mass, whatever the law of Z. (The earlier bound
    P(Z/sigma > mu*) + Phi(-ell/mu*) followed Z's tail: -6e8 at r = 2, sigma = 2, which
    made the grid of a capped query ~1e4 times coarser than its answer needs.)
    """
    tau = max(float(tail_mass), 1e-300)
    tau_hi = min(UPPER_TAIL_FACTOR * tau, 0.1)
    log1mp = math.log1p(-p) if p < 1.0 else -math.inf

    def mu_star(mass: float) -> float:
        if mass >= 1.0:
            return 0.0
        z = float(law.isf(mass))
        return (z if math.isfinite(z) else law.upper) / sigma

    def upper_remove() -> float:
        tau = tau_hi
        z1 = float(-special.ndtri(tau / 3.0))
        a = 0.5 * max(z1, 0.0) ** 2 if p < 1.0 else 0.0
        frac = tau / (3.0 * p)
        if frac < 0.5:
            ms = mu_star(frac)
            z2 = float(-special.ndtri(frac))
            a = max(a, ms * (0.5 * ms + z2))
        a = min(a, 1e300)
        hi = float(np.logaddexp(log1mp, math.log(p) + a)) if p < 1.0 else a
        return min(hi, MAX_LOSS)

    if p == 1.0:
        hi = upper_remove()
        lo = -0.5 * max(float(-special.ndtri(tau)), 0.0) ** 2
        return max(lo, -MAX_LOSS), max(hi, max(lo, -MAX_LOSS) + 1e-6)
    if Direction(direction) is Direction.REMOVE:
        return log1mp, upper_remove()
    z1 = float(-special.ndtri(tau))
    a = 0.5 * max(z1, 0.0) ** 2
    lo = -float(np.logaddexp(log1mp, math.log(p) + a))
    return max(lo, -MAX_LOSS), -log1mp
