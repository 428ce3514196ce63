"""Random-sensitivity Gaussians with discrete laws of Z: exact, atoms included (issue 12, item 4).

Before, cells were weighted by P(z_j < Z <= z_{j+1}) from the bottom of the support,
so an atom at the lowest support point was lost: Z = 1 gave epsilon 0 (the Gaussian
gives 4.38 at delta 1e-5, sigma 1) and the delta bracket [0, 0]. References here are
independent of the accountant: the Gaussian's closed form delta(eps) = Phi(-eps/mu +
mu/2) - e^eps Phi(-eps/mu - mu/2), and exact enumeration of the finite mixture.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

import fdp
from fdp.mechanisms.random_sensitivity.cells import partition


def _gauss_delta(eps: float, mu: float) -> float:
    if mu == 0.0:
        return 0.0
    return float(special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(-eps / mu - mu / 2))


def _accountant(law, sigma: float, steps: int, p: float = 1.0) -> fdp.PLDAccountant:
    mech = fdp.RandomSensitivityGaussian(law, noise_multiplier=sigma, sampling_rate=p)
    return fdp.PLDAccountant().compose(mech, steps=steps)


@pytest.mark.parametrize("law_of, c, sigma, steps", [
    ("values", 1.0, 1.0, 1), ("values", 0.5, 1.0, 1), ("values", 2.0, 3.0, 20),
    ("randint", 1.0, 1.0, 1), ("randint", 2.0, 3.0, 20),
])
def test_a_constant_sensitivity_is_the_gaussian(law_of: str, c: float, sigma: float, steps: int) -> None:
    """Z = c is Gaussian(sigma / c): T steps are mu = sqrt(T) c / sigma, in closed form."""
    law = stats.rv_discrete(values=([c], [1.0])) if law_of == "values" else stats.randint(int(c), int(c) + 1)
    mu = math.sqrt(steps) * c / sigma
    acc = _accountant(law, sigma, steps)
    truth = optimize.brentq(lambda e: _gauss_delta(e, mu) - 1e-6, 0.0, 500.0, xtol=1e-13)
    lo, hi = acc.get_epsilon_bounds(1e-6)
    assert lo <= truth <= hi and (hi - lo) / hi < 2e-3
    d_lo, d_hi = acc.get_delta_bounds(1.0)
    assert d_lo <= _gauss_delta(1.0, mu) <= d_hi


@pytest.mark.parametrize("p, steps", [(0.05, 100), (0.01, 1000)])
def test_a_constant_sensitivity_subsampled_overlaps_the_gaussian(p: float, steps: int) -> None:
    """Both brackets contain the truth, so they overlap; and they are of the same width."""
    c, sigma = 3.0, 2.0
    lo, hi = _accountant(stats.rv_discrete(values=([c], [1.0])), sigma, steps, p).get_epsilon_bounds(1e-6)
    g_lo, g_hi = fdp.PLDAccountant().compose(
        fdp.Gaussian(noise_multiplier=sigma / c, sampling_rate=p), steps=steps).get_epsilon_bounds(1e-6)
    assert max(lo, g_lo) <= min(hi, g_hi)
    assert (hi - lo) / hi < 2e-3


@pytest.mark.parametrize("q", [0.5, 0.3])
@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_bernoulli_sensitivity_composed_against_enumeration(q: float, eps: float) -> None:
    """Z in {0, 1}: after T steps the loss is that of a Gaussian with mu = sqrt(K)/sigma,
    K ~ Binomial(T, q), so delta_T(eps) = sum_k C(T,k) q^k (1-q)^(T-k) delta_gauss(eps; sqrt(k)/sigma).
    (Before: delta(1) = 8e-4 where the truth is 0.57.)"""
    sigma, steps = 1.0, 10
    exact = sum(special.comb(steps, k) * q**k * (1 - q) ** (steps - k) * _gauss_delta(eps, math.sqrt(k) / sigma)
                for k in range(steps + 1))
    lo, hi = _accountant(stats.bernoulli(q), sigma, steps).get_delta_bounds(eps)
    assert lo <= exact <= hi and hi - lo < 1e-3 * exact


def test_poisson_sensitivity_one_step_against_the_sum() -> None:
    """Many atoms, and scipy's isf is NaN far out: the atoms are found by bisection."""
    law, sigma = stats.poisson(2.0), 4.0
    acc = _accountant(law, sigma, 1)
    for eps in (0.5, 2.0):
        exact = sum(float(law.pmf(k)) * _gauss_delta(eps, k / sigma) for k in range(1, 80))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact <= hi and hi - lo < 2e-3 * exact


def test_atoms_are_listed_with_their_masses() -> None:
    from fdp.mechanisms.random_sensitivity.laws import ScipyLaw

    atoms = ScipyLaw(stats.rv_discrete(values=([0.5, 2.0], [0.25, 0.75]))(loc=1.0)).atoms()
    np.testing.assert_array_equal(atoms.z, [1.5, 3.0])
    np.testing.assert_array_equal(atoms.w, [0.25, 0.75])
    poisson = ScipyLaw(stats.poisson(4.0)).atoms()
    assert poisson.z[0] == 0 and poisson.above <= 1e-30 and abs(poisson.w.sum() - 1) < 1e-12
    assert ScipyLaw(stats.chi(3)).atoms() is None
    # nothing below the first atom: cdf(z0) - pmf(z0) said 7e-16
    assert ScipyLaw(stats.binom(10, 1e-3)).atoms().below == 0.0


def test_the_bottom_cell_keeps_an_atom_at_the_lower_end() -> None:
    """A discrete law with too many atoms to list goes through the cells; the atom at
    the lowest support point used to be left out of every cell (mass 1 - 5e-6 here)."""
    from fdp.mechanisms.random_sensitivity.laws import MAX_ATOMS, ScipyLaw

    law = ScipyLaw(stats.randint(1, 2 * MAX_ATOMS + 1))
    assert law.atoms() is None
    _, weights = partition(law, sigma=1.0, p=1.0, z_top=1e3)
    assert abs(weights.sum() - 1.0) < 1e-12
