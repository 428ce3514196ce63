"""Tests of the JL mechanism (fdp.mechanisms.jl) and its chi-square quadrature kernels.

References: mpmath quadrature over the chi-square density at mp.dps = 30
(computed in the tests themselves), exact subsampled-Gaussian cells
(fdp.mechanisms.gaussian), and a slow NumPy fine-binning reference.
"""

from __future__ import annotations

import json
import math
import warnings

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

import fdp
from fdp._kernels.chi2 import log_ndtr_pair, mixture_cells
from fdp.mechanisms.gaussian import subsampled_gaussian_cells, subsampled_gaussian_delta
from fdp.mechanisms.jl import JL, MAX_LOSS, RandomSensitivityGaussian, jl_alpha_beta, jl_delta
from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic

mp.mp.dps = 30


# ------------------------------------------------------------ references
def _mp_expect_chi2(g, r):
    """E[g(Z)], Z = 1/sqrt(chi2_r/r), by mp.quad over the chi2_r density (substitution c = u^2)."""
    r = mp.mpf(r)

    def dens_u(u):  # density of u = sqrt(c): 2u * chi2 pdf(u^2)
        c = u * u
        return 2 * u * c ** (r / 2 - 1) * mp.exp(-c / 2) / (2 ** (r / 2) * mp.gamma(r / 2))

    def f(u):
        if u == 0:
            return mp.mpf(0)
        return dens_u(u) * g(mp.sqrt(r) / u)

    s = mp.sqrt(r)
    return mp.quad(f, [0, s / 8, s / 2, s, 1.5 * s, 2 * s, 4 * s, mp.inf])


def _mp_phi(x):
    return mp.ncdf(x)


# ------------------------------------------------------------------ the law of Z
@pytest.mark.parametrize("r", [1, 2, 3, 7])
def test_chi_law_tails_match_mpmath(r):
    """cdf and sf of Z = 1/sqrt(chi2_r/r) to a few ulps relative in both tails (the
    closed forms for r = 1, 2 and scipy's incomplete gamma otherwise)."""
    from fdp.mechanisms.random_sensitivity.laws import ChiLaw

    law = ChiLaw(r)
    z = np.array([1e-3, 0.05, 0.2, 0.5, 0.9, 1.0, 1.3, 3.0, 30.0, 1e4, 1e8])
    cdf, sf = law.cdf(z), law.sf(z)
    with mp.workdps(40):
        for zi, c, s in zip(z, cdf, sf):
            x = mp.mpf(r) / mp.mpf(zi) ** 2  # Z <= z <=> chi2_r >= x
            ref_c = mp.gammainc(mp.mpf(r) / 2, x / 2, mp.inf, regularized=True)
            ref_s = mp.gammainc(mp.mpf(r) / 2, 0, x / 2, regularized=True)
            for got, ref in ((c, ref_c), (s, ref_s)):
                assert abs(mp.mpf(got) - ref) <= 1e-13 * ref + mp.mpf("1e-300")


# ------------------------------------------------------------------ kernels
@pytest.mark.parametrize("x", [-1e4, -300.0, -40.0, -37.5, -36.9, -8.0, -0.3, 0.0, 0.7, 9.0, 38.0, 500.0])
def test_log_ndtr_pair_matches_mpmath(x):
    lo, hi = log_ndtr_pair(x)
    with mp.workdps(60):  # log(1 - tiny) via log1p so the reference keeps its relative digits
        ref_lo = float(mp.log(mp.ncdf(x)) if x <= 0 else mp.log1p(-mp.ncdf(-x)))
        ref_hi = float(mp.log(mp.ncdf(-x)) if x >= 0 else mp.log1p(-mp.ncdf(x)))
    for got, ref in ((lo, ref_lo), (hi, ref_hi)):
        assert abs(got - ref) <= 1e-13 * abs(ref) + 1e-320


@pytest.mark.parametrize("p", [1.0, 0.3, 0.01])
@pytest.mark.parametrize("mu", [0.2, 1.7, 6.0])
@pytest.mark.parametrize("direction", list(Direction))
def test_kernel_single_component_matches_gaussian_cells(p, mu, direction):
    lo = -3.0 if (direction is Direction.ADD or p == 1.0) else math.log1p(-p) - 0.01
    g = Grid.covering(lo, 25.0, 0.01)
    ref = subsampled_gaussian_cells(mu, p, direction, g)
    pc, uc, tails = mixture_cells(g.offset, g.h, g.n, np.array([mu]), np.array([1.0]), np.array([0.0]), 0.0, np.inf,
                                  p, direction is Direction.REMOVE, True, np.inf)
    np.testing.assert_allclose(pc, ref.p_cell, rtol=1e-11, atol=1e-300)
    assert np.max(np.abs(uc - ref.u_cell) / np.maximum(ref.p_cell, 1e-300)) < 1e-11
    np.testing.assert_allclose(tails[:4], [ref.p_left, ref.d_left, ref.p_right, ref.u_right],
                               rtol=1e-11, atol=1e-300)
    assert tails[4] == 0.0


# ----------------------------------------------------- tradeoff quadrature
@pytest.mark.parametrize("sigma,r,t", [(0.6, 1, 0.5), (0.6, 5, -1.0), (0.6, 10, 2.0),
                                       (1.0, 3, 0.0), (2.0, 30, 0.3), (0.8, 2, 8.0)])
def test_alpha_beta_match_mpmath(sigma, r, t):
    a, b = jl_alpha_beta(np.array([t]), sigma, r)
    ref_a = _mp_expect_chi2(lambda z: _mp_phi(-t * sigma / z - z / (2 * sigma)), r)
    ref_b = _mp_expect_chi2(lambda z: _mp_phi(t * sigma / z - z / (2 * sigma)), r)
    assert abs(a[0] - float(ref_a)) <= 1e-9
    assert abs(b[0] - float(ref_b)) <= 1e-9


@pytest.mark.parametrize("r,eps", [(1, 1.0), (5, 0.5), (5, 4.0), (10, 2.0), (30, 1.0)])
def test_delta_matches_mpmath_p1(r, eps):
    sigma = 0.8

    def dg(z):
        mu = z / sigma
        return _mp_phi(-eps / mu + mu / 2) - mp.exp(eps) * _mp_phi(-eps / mu - mu / 2)

    ref = float(_mp_expect_chi2(dg, r))
    got = float(jl_delta(np.array([eps]), sigma, r, 1.0)[0])
    assert abs(got - ref) <= 1e-9 + 1e-7 * ref


def test_tradeoff_is_symmetric_at_p1():
    m = JL(noise_multiplier=0.8, jl_projections=4)
    f = m.tradeoff()
    alpha = np.linspace(0.01, 0.99, 15)
    np.testing.assert_allclose(f(f(alpha)), alpha, atol=1e-7)
    eps = np.array([0.1, 1.0, 3.0])
    np.testing.assert_allclose(m.delta(eps, "remove"), m.delta(eps, "add"), rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------- soundness of cells
def _delta_of(pld, eps):
    return np.array([float(pld.delta(e)) for e in eps])


@pytest.mark.parametrize("direction", list(Direction))
@pytest.mark.parametrize("r,p", [(3, 0.1), (10, 1.0), (20, 0.05)])
def test_cells_bracket_quadrature_delta(direction, r, p):
    m = JL(noise_multiplier=0.9, jl_projections=r, sampling_rate=p)
    lo, hi = m.loss_range(direction, 1e-12)
    g = Grid.covering(lo, hi, 0.01)
    cp = m.loss_cells(direction, g, pessimistic=True)
    co = m.loss_cells(direction, g, pessimistic=False)
    assert cp.total_mass == pytest.approx(1.0, abs=1e-12)
    assert co.total_mass == pytest.approx(1.0, abs=1e-12)
    eps = np.array([0.0, 0.05, 0.3, 1.0, 2.0])
    dp, do = _delta_of(discretise_pessimistic(cp), eps), _delta_of(discretise_optimistic(co), eps)
    exact = m.delta(eps, direction)
    assert np.all(dp >= exact - 1e-12)
    assert np.all(do <= exact + 1e-12)
    assert np.all(dp >= do)
    assert np.all(dp - do <= 0.1 * exact + 1e-4)  # and reasonably tight (grid h = 0.01)


def _fine_binned_delta(sigma, r, p, direction, eps, k=4000):
    """Slow NumPy reference: chi2_r cut into k equal-probability bins, Z rounded to the
    bin's upper end (upper bound) or lower end (lower bound), exact Gaussian deltas."""
    q = np.linspace(0.0, 1.0, k + 1)
    c = stats.chi2.ppf(q, r)  # chi2 edges, 0 .. inf
    with np.errstate(divide="ignore"):
        z = np.sqrt(r / c)  # inf .. 0, decreasing
    w = np.diff(q)
    up = np.zeros_like(eps)
    low = np.zeros_like(eps)
    for j in range(k):
        z_hi, z_lo = z[j], z[j + 1]
        if np.isfinite(z_hi):
            up += w[j] * subsampled_gaussian_delta(eps, z_hi / sigma, p, direction)
        else:  # mu = inf: remove delta = p + ((1-p) - e^eps)_+, add = (1 - (1-p) e^eps)_+
            if direction is Direction.REMOVE:
                up += w[j] * (p + np.maximum(0.0, (1 - p) - np.exp(eps)))
            else:
                up += w[j] * (np.maximum(0.0, 1 - (1 - p) * np.exp(eps)) if p < 1 else 1.0)
        if z_lo > 0:
            low += w[j] * subsampled_gaussian_delta(eps, z_lo / sigma, p, direction)
    return low, up


@pytest.mark.parametrize("direction", list(Direction))
def test_fine_binning_reference_brackets(direction):
    sigma, r, p = 1.0, 4, 0.2
    m = JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)
    eps = np.array([0.1, 0.5, 1.5])
    ref_lo, ref_hi = _fine_binned_delta(sigma, r, p, direction, eps)
    lo, hi = m.loss_range(direction, 1e-12)
    g = Grid.covering(lo, hi, 0.005)
    dp = _delta_of(discretise_pessimistic(m.loss_cells(direction, g, pessimistic=True)), eps)
    do = _delta_of(discretise_optimistic(m.loss_cells(direction, g, pessimistic=False)), eps)
    quad = m.delta(eps, direction)
    assert np.all(ref_lo <= quad + 1e-12) and np.all(quad <= ref_hi + 1e-12)
    assert np.all(do <= ref_hi + 1e-12)
    assert np.all(ref_lo <= dp + 1e-12)


def test_heavy_tail_goes_to_infinity_not_dropped():
    m = JL(noise_multiplier=0.6, jl_projections=1, sampling_rate=0.01)
    lo, hi = m.loss_range(Direction.REMOVE, 1e-12)
    assert 1e3 < hi <= MAX_LOSS  # the range follows the polynomial tail, far beyond the bulk
    hi = 2000.0  # a grid that stops early: the mass above it must reach +inf
    g = Grid.covering(lo, hi, 0.5)
    c = m.loss_cells(Direction.REMOVE, g, pessimistic=True)
    assert c.total_mass == pytest.approx(1.0, abs=1e-12)
    # P(L > hi) ~ p P(chi2_1 < 1/(2 sigma^2 hi)) is charged to +inf
    approx = 0.01 * stats.chi2.cdf(1.0 / (2 * 0.36 * hi), 1)
    assert c.p_inf + c.p_right >= 0.5 * approx


# ------------------------------------------------------------- composition
def _bounds(mech, steps, h=0.02):
    acc = fdp.PLDAccountant(grid_spacing=h).compose(mech, steps=steps)
    return acc.get_epsilon_bounds(1e-5)


def test_jl_is_worse_than_gaussian_and_decreasing_in_r():
    sigma, p, steps = 1.0, 0.05, 40
    g_lo, g_hi = _bounds(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps)
    prev_hi = math.inf
    for r in (2, 5, 20, 100):
        lo, hi = _bounds(JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p), steps)
        assert lo <= hi
        assert hi >= g_lo
        assert lo >= g_lo - 1e-3 * g_lo
        assert hi <= prev_hi
        prev_hi = hi


def test_large_r_tends_to_gaussian():
    """Both brackets refined to 0.1 %: JL(r = 10^4) reaches the Gaussian's lower bound and
    is within 0.2 % of its upper bound (at a fixed coarse grid the JL lower bound can be
    the tighter of the two lower bounds, so only refined brackets are compared)."""
    sigma, p, steps = 1.0, 0.05, 40
    g_lo, g_hi = fdp.PLDAccountant().compose(
        fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps).get_epsilon_bounds(1e-5)
    lo, hi = fdp.PLDAccountant().compose(
        JL(noise_multiplier=sigma, jl_projections=10_000, sampling_rate=p), steps).get_epsilon_bounds(1e-5)
    assert hi >= g_lo
    assert hi <= 1.002 * g_hi


def test_random_sensitivity_point_mass_is_gaussian():
    sigma, p = 1.0, 0.1
    z = stats.uniform(loc=1.0, scale=1e-9)  # Z = 1 (to 1e-9)
    m = RandomSensitivityGaussian(z, noise_multiplier=sigma, sampling_rate=p)
    eps = np.array([0.0, 0.2, 1.0])
    for d in Direction:
        np.testing.assert_allclose(m.delta(eps, d), subsampled_gaussian_delta(eps, 1.0, p, d), rtol=1e-7)
    lo, hi = _bounds(m, 30)
    g_lo, g_hi = _bounds(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), 30)
    assert hi == pytest.approx(g_hi, rel=2e-3) and lo == pytest.approx(g_lo, rel=2e-3)


def test_random_sensitivity_delta_matches_mpmath():
    sigma, eps = 0.7, 0.8
    dist = stats.chi(df=3)  # Z ~ chi_3 (unbounded)
    m = RandomSensitivityGaussian(dist, noise_multiplier=sigma)

    def dens(z):
        return mp.sqrt(2 / mp.pi) * z * z * mp.exp(-z * z / 2)

    def dg(z):
        mu = z / sigma
        return _mp_phi(-eps / mu + mu / 2) - mp.exp(eps) * _mp_phi(-eps / mu - mu / 2)

    ref = float(mp.quad(lambda z: dens(z) * dg(z) if z > 0 else 0, [0, 1, 2, 4, 8, mp.inf]))
    assert abs(float(m.delta(eps)) - ref) <= 1e-9


# --------------------------------------------------------------- API
def test_json_round_trip_and_registry():
    m = JL(noise_multiplier=0.6, jl_projections=5, sampling_rate=256 / 25000)
    d = m.to_dict()
    assert d["kind"] == "jl"
    assert fdp.mechanisms.base.mechanism_from_dict(json.loads(json.dumps(d))) == m
    acc = fdp.PLDAccountant().compose(m, steps=3)
    assert fdp.PLDAccountant.from_json(acc.to_json()).events == acc.events
    rsg = RandomSensitivityGaussian(stats.chi(3), noise_multiplier=1.0)
    with pytest.raises(ValueError, match="JSON"):
        rsg.to_dict()


def test_exports():
    assert fdp.JL is JL and fdp.RandomSensitivityGaussian is RandomSensitivityGaussian
    assert JL(noise_multiplier=1.0, jl_projections=2).is_symmetric()


@pytest.mark.parametrize("kwargs,name", [
    (dict(noise_multiplier=0.0, jl_projections=3), "noise_multiplier"),
    (dict(noise_multiplier=-1.0, jl_projections=3), "noise_multiplier"),
    (dict(noise_multiplier=float("nan"), jl_projections=3), "noise_multiplier"),
    (dict(noise_multiplier=1.0, jl_projections=0), "jl_projections"),
    (dict(noise_multiplier=1.0, jl_projections=2.5), "jl_projections"),
    (dict(noise_multiplier=1.0, jl_projections=float("nan")), "jl_projections"),
    (dict(noise_multiplier=1.0, jl_projections=3, sampling_rate=0.0), "sampling_rate"),
    (dict(noise_multiplier=1.0, jl_projections=3, sampling_rate=1.5), "sampling_rate"),
    (dict(noise_multiplier=1.0, jl_projections=3, sampling_rate=float("nan")), "sampling_rate"),
])
def test_bad_input_names_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        JL(**kwargs)


def test_random_sensitivity_bad_input():
    with pytest.raises(ValueError, match="z_distribution"):
        RandomSensitivityGaussian("chi", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="z_distribution"):
        RandomSensitivityGaussian(stats.norm(), noise_multiplier=1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        RandomSensitivityGaussian(stats.chi(2), noise_multiplier=float("nan"))
    with pytest.raises(ValueError, match="sampling_rate"):
        RandomSensitivityGaussian(stats.chi(2), noise_multiplier=1.0, sampling_rate=0)


@pytest.mark.parametrize("r", [2, 3])
def test_small_r_range_follows_the_tail_to_a_finite_upper_bound(r):
    """eps in the thousands (r = 3) or millions (r = 2): no fixed cap may turn it into inf."""
    p, steps = 256 / 25000, 98
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lo, hi = fdp.PLDAccountant().compose(JL(noise_multiplier=0.6, jl_projections=r, sampling_rate=p),
                                             steps).get_epsilon_bounds(1e-5)
    g_lo, _ = fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=0.6, sampling_rate=p),
                                          steps).get_epsilon_bounds(1e-5)
    assert g_lo <= lo <= hi < math.inf
    assert hi > 2000.0  # beyond the old fixed cap of the loss grid


def _mp_remove_delta_r1(eps, sigma, p):
    """delta(eps) of one subsampled JL step with r = 1 (remove), by mp.quad in log chi2.

    Only chi2 < 2 mu_eps^-2 sigma^-2 matters (mu = Z / sigma must reach sqrt(2 eps)), so the
    integral runs over u = log chi2 around that scale.
    """
    eps, sigma, p = mp.mpf(eps), mp.mpf(sigma), mp.mpf(p)

    def dsg(mu):
        x = (mp.log((mp.e ** eps - (1 - p)) / p) + mu ** 2 / 2) / mu
        return (1 - p) * mp.ncdf(-x) + p * mp.ncdf(mu - x) - mp.e ** eps * mp.ncdf(-x)

    def f(u):
        c = mp.e ** u
        return dsg(1 / (mp.sqrt(c) * sigma)) * c * mp.exp(-c / 2) / mp.sqrt(2 * mp.pi * c)

    top = mp.log(1 / (sigma ** 2 * eps)) + 2
    # the integrand steps where mu = 1 / (sqrt(c) sigma) crosses mu* = sqrt(2 (eps - log p)),
    # within a few units of mu: break the integral there (u = log c moves by 2 dmu / mu)
    mu_star = mp.sqrt(2 * (eps - mp.log(p)))
    u_star = -2 * mp.log(sigma * mu_star)
    steps = [u_star + k * 2 / mu_star for k in range(-16, 17, 2)]
    pts = sorted(set([top - 80, top - 40, top - 20, top - 10, top - 5, top - 2, top]
                     + [u for u in steps if top - 80 < u < top]))
    return mp.quad(f, pts)


@pytest.mark.parametrize("h", [1.8e9, 9.5e6])
def test_block_merged_atoms_stay_below_their_likelihood_ratio_on_coarse_grids(h):
    """r = 1 spans losses to ~1e15, so its grids are coarse and most components are merged
    over blocks of many cells. Each merged atom must sit at or below the block's likelihood
    ratio: a one-step optimistic delta above the truth would make every lower bound unsound
    (it once was, 2x at eps = 1e9, when u/P rounded to 1)."""
    sigma, p = 0.6, 256 / 25000
    mech = JL(noise_multiplier=sigma, jl_projections=1, sampling_rate=p)
    grid = Grid.covering(math.log1p(-p), min(1e15, h * 2 ** 20), h)
    lower = discretise_optimistic(mech.loss_cells(Direction.REMOVE, grid, pessimistic=False))
    upper = discretise_pessimistic(mech.loss_cells(Direction.REMOVE, grid, pessimistic=True))
    for eps in (1e9, 1e10, 1e11):
        truth = float(_mp_remove_delta_r1(eps, sigma, p))
        assert float(lower.delta(eps)) <= truth * (1 + 1e-9)
        assert float(upper.delta(eps)) >= truth * (1 - 1e-9)
    assert float(lower.delta(1e10)) > 0.5 * float(_mp_remove_delta_r1(1e10, sigma, p))


def test_heavy_tail_lower_bound_uses_capped_grids():
    """r = 1: the automatic grid spans ~1e15 and its lower bound is useless; grids cut at a
    cap (mass above moved down to the cap) give a lower bound within 10x of the upper."""
    mech = JL(noise_multiplier=0.6, jl_projections=1, sampling_rate=256 / 25000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lo, hi = fdp.PLDAccountant().compose(mech, 98).get_epsilon_bounds(1e-5)
    assert 1e9 < lo <= hi < 10 * lo


@pytest.mark.parametrize("eps", [1e3, 1e5, 1e9])
def test_delta_quadrature_resolves_the_step_at_large_eps(eps):
    """At large eps the integrand over Z steps from ~0 to ~p within a few units of
    mu = Z / sigma around sqrt(2 (eps - log p)); the fixed panels alone were off by
    up to 2.5 % there (r = 1)."""
    sigma, p = 0.6, 256 / 25000
    got = float(JL(noise_multiplier=sigma, jl_projections=1, sampling_rate=p).delta(eps))
    assert got == pytest.approx(float(_mp_remove_delta_r1(eps, sigma, p)), rel=1e-9)


def test_docs_jl_example_runs_and_its_bracket_holds():
    """docs/jl.md's code block runs as written; its bracket comment matches."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "jl.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    ns: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        exec(compile(block, "docs/jl.md", "exec"), ns)
        lo, hi = ns["acc"].get_epsilon_bounds(delta=1e-5)
    stated = [float(v) for v in re.search(r"~ \(([\d.]+), ([\d.]+)\)", block).groups()]
    assert lo == pytest.approx(stated[0], abs=0.05) and hi == pytest.approx(stated[1], abs=0.05)
