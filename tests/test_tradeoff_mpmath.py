"""The Gaussian curve and its delta(eps) against mpmath at 50 significant digits.

Reference: mpmath (mp.dps = 50) evaluating the defining formulas directly,
G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) and
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
(Dong-Roth-Su, arXiv:1905.02383, Definition 2.6 and Corollary 2.13), at the
extreme points the brief names: alpha down to 1e-12, eps up to 30, mu in [0.1, 10].
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import fdp
from fdp.tradeoff import conjugate_delta

mp.mp.dps = 50

MUS = [0.1, 0.5, 1.0, 3.0, 10.0]


def mp_gauss_curve(alpha: float, mu: float) -> mp.mpf:
    a = mp.mpf(alpha)  # the float itself, exactly
    z = -mp.sqrt(2) * mp.erfinv(2 * a - 1)  # Phi^-1(1 - a) = -Phi^-1(a)
    return mp.ncdf(z - mu)


def mp_gauss_delta(eps: float, mu: float) -> mp.mpf:
    e, m = mp.mpf(eps), mp.mpf(mu)
    return mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)


def _rel_close(got: float, want: mp.mpf, rtol: float) -> bool:
    if want < mp.mpf("1e-300"):  # below float range: the float answer must be ~0
        return abs(got) <= 1e-300
    return abs(mp.mpf(got) - want) <= rtol * abs(want)


@pytest.mark.parametrize("mu", MUS)
@pytest.mark.parametrize("alpha", [1e-12, 1e-8, 1e-3, 0.3, 0.7, 1 - 1e-6, 1 - 1e-12])
def test_gaussian_curve_matches_mpmath(alpha, mu):
    got = fdp.gaussian_curve(mu)(alpha)
    want = mp_gauss_curve(alpha, mu)
    assert _rel_close(got, want, 1e-12), (got, mp.nstr(want, 20))
    # the complement 1 - G_mu(alpha) keeps relative precision too
    comp = float(fdp.gaussian_curve(mu)._evaluate_complement(np.array([alpha]))[0])
    assert _rel_close(comp, 1 - want, 1e-12), (comp, mp.nstr(1 - want, 20))


@pytest.mark.parametrize("mu", MUS)
@pytest.mark.parametrize("eps", [0.0, 0.01, 0.5, 1.0, 3.0, 10.0, 30.0])
def test_gaussian_delta_matches_mpmath(eps, mu):
    got = fdp.gaussian_curve(mu).delta(eps)
    want = mp_gauss_delta(eps, mu)
    assert _rel_close(got, want, 1e-11), (got, mp.nstr(want, 20))


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0, 10.0])
def test_generic_conjugate_matches_mpmath_absolutely(mu):
    eps = np.array([0.0, 0.5, 2.0, 10.0, 30.0])
    got = conjugate_delta(fdp.gaussian_curve(mu), eps)
    want = np.array([float(mp_gauss_delta(e, mu)) for e in eps])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # certified upper bound, up to rounding of the curve values
    assert np.all(got >= want - 1e-15)
