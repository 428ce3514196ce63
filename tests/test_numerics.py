"""Numerical primitives: cell masses of the normal law, complex powers, log-MGF bound."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

from fdp._kernels.power import complex_power
from fdp._numerics import log_norm_cells, log_norm_interval
from fdp.pld.pmf import DiscretePLD

mp.mp.dps = 40


@pytest.mark.parametrize(
    "points",
    [
        np.linspace(-40.0, 40.0, 801),
        np.concatenate([[-np.inf], np.linspace(-3.0, 45.0, 97), [np.inf]]),
        np.array([-1e3, -38.5, -1e-9, 0.0, 1e-9, 2.0, 37.0, 39.0]),
    ],
)
def test_log_norm_cells_match_mpmath_and_the_pairwise_rule(points):
    """Full relative precision in the tails; near zero (where both ends are ~1/2) the
    mass is a difference of O(1) numbers, so it is exact to a few 1e-16 absolute."""
    got = log_norm_cells(points)
    pairwise = log_norm_interval(points[:-1], points[1:])
    np.testing.assert_allclose(np.exp(got), np.exp(pairwise), rtol=1e-12, atol=4e-16)
    for k in range(0, points.size - 1, max(1, (points.size - 1) // 40)):
        a, b = (mp.mpf(float(x)) if np.isfinite(x) else mp.mpf(x) for x in points[k:k + 2])
        exact = mp.ncdf(-a) - mp.ncdf(-b) if a > 0 else mp.ncdf(b) - mp.ncdf(a)
        if exact > 1e-300:
            assert abs(mp.exp(got[k]) - exact) <= 1e-12 * exact + 4e-16
    # decreasing points give the same cells, reversed
    np.testing.assert_array_equal(log_norm_cells(points[::-1]), got[::-1])


@pytest.mark.parametrize("n", [1, 2, 3, 98, 1465, 100_000, 10**12])
def test_complex_power_matches_numpy(n):
    rng = np.random.default_rng(n % 1000)
    z = rng.uniform(0.2, 1.0, 4096) ** 0.001 * np.exp(1j * rng.uniform(-np.pi, np.pi, 4096))
    expected = np.power(z, n)
    got = complex_power(z.copy(), n)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-300)
    with pytest.raises(ValueError, match="n must be"):
        complex_power(z.copy(), 0)


@pytest.mark.parametrize("lam", [1e-3, 0.5, 30.0, 5e3, -2.0, -4e3])
def test_log_mgf_is_a_tight_upper_bound(lam):
    """The early exit bounds the remaining terms: never below the exact value."""
    rng = np.random.default_rng(7)
    pmf = rng.uniform(0.0, 1.0, 20_000) ** 4
    pmf /= pmf.sum()
    pld = DiscretePLD(h=1e-3, offset=-9_000, pmf=pmf)
    exact = mp.log(mp.fsum(mp.mpf(float(w)) * mp.exp(mp.mpf(lam) * float(ell))
                           for w, ell in zip(pmf, pld.losses)))
    got = float(pld.log_mgf(np.array([lam]))[0])
    assert got >= float(exact) - 1e-15 * abs(float(exact))
    assert got - float(exact) < 1e-9
