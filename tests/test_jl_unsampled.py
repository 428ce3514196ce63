"""fdp.JL without subsampling (p = 1; and p = 0.5, 0.2): brackets against independent references, and tight.

At p = 1 one step is the Gaussian mechanism with mu = Z / sigma (Z released), and T steps
are the Gaussian with mu^2 = (Z_1^2 + ... + Z_T^2) / sigma^2, so

    delta_1(eps) = E[delta_G(eps; Z / sigma)],   delta_2(eps) = E[delta_G(eps; |(Z_1, Z_2)| / sigma)],

references computed here by mpmath over the chi density of Z (``_mp_step_delta`` of
test_jl_second_order.py, 20-30 digits) and by nested scipy quadrature (T = 2).

At sigma = 2 the answer at delta = 1e-5 is set by mu = Z/sigma near 0.5-1.5 for r >= 20.
The Z-cells used to be 1 % wide (relative) only where mu >= 1, and 13-38 % wide below, so
the two-point / Jensen bounds of a cell erred at first order there: the eps bracket was
11 % wide at r = 20, 0.6 % at r = 100 (and 1.2 % at r = 20, T = 10). The lower end of a
step's loss range at p = 1 followed Z's tail (-6e8 at r = 2), which made the grid of a
delta query capped at eps + 40 ~1e4 times coarser than the answer needs (delta bracket
[2e-7, 1e-5] at r = 2, T = 10).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate
from test_jl_second_order import _mp_step_delta

import fdp
from fdp.mechanisms.random_sensitivity.cells import ETA_REL, partition
from fdp.mechanisms.random_sensitivity.laws import ChiLaw
from fdp.pld.cells import Direction

SIGMA = 2.0
DELTA = 1e-5
RTOL = 1e-3  # the accountant's default epsilon_rtol


def _accountant(r: int, steps: int) -> fdp.PLDAccountant:
    return fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=SIGMA, jl_projections=r, sampling_rate=1.0), steps)


def _truth_1(eps: float, r: int) -> float:
    """delta of one step at p = 1 (both directions agree), mpmath over Z's density, with
    interval ends around the Z where the integrand steps (mu ~ sqrt(2 eps))."""
    z_star = SIGMA * math.sqrt(2 * eps)
    breaks = [z_star * f for f in (0.5, 0.9, 0.99, 1.0, 1.01, 1.1, 2.0)]
    return float(_mp_step_delta(eps, SIGMA, r, 1.0, True, breaks, dps=30))


def _chi_density(r: int):
    """Density of Z = sqrt(r / X), X ~ chi2_r."""
    c = -(r / 2) * math.log(2.0) - math.lgamma(r / 2)

    def dens(z: float) -> float:
        if z <= 0.0:
            return 0.0
        x = r / (z * z)
        return math.exp(c + (r / 2 - 1) * math.log(x) - x / 2) * 2 * r / z**3

    return dens


def _gauss_delta(mu: float, eps: float) -> float:
    return 0.5 * math.erfc((eps / mu - mu / 2) / math.sqrt(2)) - math.exp(eps) * 0.5 * math.erfc(
        (eps / mu + mu / 2) / math.sqrt(2))


def _truth_2(eps: float, r: int) -> float:
    """delta of two steps at p = 1: E[delta_G(eps; |(Z_1, Z_2)| / sigma)] by nested scipy quad."""
    dens = _chi_density(r)

    def inner(z1: float) -> float:
        return integrate.quad(lambda z2: dens(z2) * _gauss_delta(math.hypot(z1, z2) / SIGMA, eps),
                              0.0, np.inf, epsabs=1e-15, epsrel=1e-11, limit=200)[0]

    return integrate.quad(lambda z1: dens(z1) * inner(z1), 0.0, np.inf, epsabs=1e-15, epsrel=1e-11, limit=200)[0]


def test_cells_are_fine_below_mu_one():
    """The relative width rule holds at every mu > 0 (it held only where mu >= 1: a cell
    38 % wide at Z ~ 1.4-1.96, mu < 1, at r = 20)."""
    law = ChiLaw(20)
    edges, weights = partition(law, SIGMA, 1.0, 54.0)
    lo, hi = edges[:-1], edges[1:]
    inner = (lo > 0) & np.isfinite(hi) & (hi <= 54.0)
    assert np.all(hi[inner] / lo[inner] <= 1 + ETA_REL * (1 + 1e-9))
    assert np.sum(inner & (hi < SIGMA)) > 50  # mu < 1 is where eps is decided here
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("r", [1, 2, 20])
def test_lower_end_of_the_loss_range_at_p1_is_gaussian(r):
    """P(L < -ell | mu) = Phi(-(ell/mu + mu/2)) <= Phi(-sqrt(2 ell)) for every mu, so the lower
    end does not follow Z's tail (it was -6e8 at r = 2 for tail mass 1e-16). Checked against
    the exact mixture by mpmath."""
    import mpmath as mp

    tau = 1e-16
    lo, _ = fdp.JL(noise_multiplier=SIGMA, jl_projections=r).loss_range(Direction.REMOVE, tau)
    assert -40.0 < lo < -30.0
    ell = -lo
    with mp.workdps(30):
        def dens(z):
            x = r / z**2
            return mp.exp((mp.mpf(r) / 2 - 1) * mp.log(x) - x / 2 - (mp.mpf(r) / 2) * mp.log(2)
                          - mp.loggamma(mp.mpf(r) / 2)) * 2 * r / z**3

        def below(z):  # P(L < lo | Z = z)
            mu = z / SIGMA
            return mp.ncdf(-(ell / mu + mu / 2))

        z_peak = SIGMA * math.sqrt(2 * ell)  # where the conditional mass peaks (at tau)
        mass = mp.quad(lambda z: dens(z) * below(z), [0, 1, z_peak / 2, z_peak, 2 * z_peak, mp.inf])
    assert 0 < float(mass) <= tau


@pytest.mark.parametrize("r", [20, 30, 50, 100])
def test_one_step_epsilon_bracket_contains_mpmath_and_is_within_rtol(r):
    """Were 11 %, 5.6 %, 2.2 % and 0.6 % wide."""
    lo, hi = _accountant(r, 1).get_epsilon_bounds(DELTA)
    assert 0 < hi - lo <= RTOL * hi
    # delta(eps) decreases: the exact eps lies in [lo, hi] iff delta(hi) <= DELTA <= delta(lo)
    assert _truth_1(hi, r) <= DELTA * (1 + 1e-9) and DELTA <= _truth_1(lo, r) * (1 + 1e-9)


def test_one_step_epsilon_at_r20_is_the_quadrature_value():
    """The brief's reference value: eps = 2.72569 at r = 20, sigma = 2, delta = 1e-5."""
    lo, hi = _accountant(20, 1).get_epsilon_bounds(DELTA)
    assert lo <= 2.72569 <= hi
    assert _truth_1(2.72569, 20) == pytest.approx(DELTA, rel=1e-4)  # 6 digits of eps: ~3e-5 in delta


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_moderate_sampling_rate_one_step_bracket_contains_mpmath_and_is_within_rtol(p):
    """The same cells decide eps at p = 0.5, 0.2 (r = 20, sigma = 2): the brackets were
    3.2 % and 3.3 % wide. Reference: max over both directions, mpmath."""
    r = 20
    lo, hi = fdp.PLDAccountant().compose(
        fdp.JL(noise_multiplier=SIGMA, jl_projections=r, sampling_rate=p), 1).get_epsilon_bounds(DELTA)
    assert 0 < hi - lo <= RTOL * hi

    def truth(eps):
        return max(float(_mp_step_delta(eps, SIGMA, r, p, remove, dps=30)) for remove in (True, False))

    assert truth(hi) <= DELTA * (1 + 1e-9) and DELTA <= truth(lo) * (1 + 1e-9)


@pytest.mark.parametrize("r,eps", [(2, 12500.0), (20, 2.7257), (100, 2.1041)])
def test_one_step_delta_bracket_contains_mpmath_and_meets_the_tolerance(r, eps):
    """The upper curve reaches the lower bound within rtol * max(eps, 1) of eps (the
    delta query's tolerance); it was 1.7 %, 3.1x and 7.8 % above it there."""
    acc = _accountant(r, 1)
    lo, hi = acc.get_delta_bounds(eps)
    truth = _truth_1(eps, r)
    assert lo <= truth * (1 + 1e-9) and truth <= hi * (1 + 1e-9)
    assert acc.get_delta_bounds(eps + RTOL * max(eps, 1.0))[1] <= lo


@pytest.mark.parametrize("r", [20, 100])
def test_two_steps_epsilon_bracket_contains_quadrature_and_is_within_rtol(r):
    lo, hi = _accountant(r, 2).get_epsilon_bounds(DELTA)
    assert 0 < hi - lo <= RTOL * hi
    assert _truth_2(hi, r) <= DELTA * (1 + 1e-7) and DELTA <= _truth_2(lo, r) * (1 + 1e-7)


@pytest.mark.parametrize("r,steps", [(10, 10), (20, 10), (30, 10), (50, 10), (20, 100), (30, 100)])
def test_many_steps_epsilon_bracket_is_within_rtol(r, steps):
    """Were 0.13 %, 1.2 %, 0.48 %, 0.19 % (T = 10) and 0.31 %, 0.15 % (T = 100) wide."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "not as tight as asked" warning
        lo, hi = _accountant(r, steps).get_epsilon_bounds(DELTA)
    assert 0 < hi - lo <= RTOL * hi


def test_heavy_tail_delta_bracket_over_ten_steps_meets_the_tolerance():
    """r = 2, T = 10, eps ~ 1.25e5 (delta ~ 1e-5): was [2.1e-7, 1.03e-5], the capped grid's h
    ~ 700 set by a loss range reaching -6e8 below."""
    eps = 125020.0
    acc = _accountant(2, 10)
    lo, hi = acc.get_delta_bounds(eps)
    assert 0.99e-5 < lo <= hi < 1.01e-5
    assert acc.get_delta_bounds(eps + RTOL * eps)[1] <= lo
