"""Tradeoff-curve algebra: properties over random curves and checks against the maths.

Reference values come from closed forms stated next to each test (derived in
the docstrings) or from mpmath at 50 digits (``test_tradeoff_mpmath.py``); no
number here is copied from a previous run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples
from scipy.special import ndtr, ndtri

import fdp
from fdp.tradeoff import (
    InverseCurve,
    SubsampledCurve,
    conjugate_delta,
    convex_minimum,
    gaussian_delta,
)

GRID = np.linspace(0.0, 1.0, 257)
FAST = settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------- strategies
def _pair_atoms(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Privacy-loss atoms of a discrete pair (P, Q): losses log(P/Q) under P."""
    both = (p > 0) & (q > 0)
    p_inf = float(p[(p > 0) & (q == 0)].sum())
    return np.log(p[both] / q[both]), p[both], p_inf


@st.composite
def discrete_pairs(draw, max_k: int = 6) -> tuple[np.ndarray, np.ndarray]:
    k = draw(st.integers(2, max_k))
    w = st.floats(0.01, 1.0)
    p = np.array(draw(st.lists(w, min_size=k, max_size=k)))
    q = np.array(draw(st.lists(w, min_size=k, max_size=k)))
    if draw(st.booleans()):  # a point where Q has no mass: P-mass at loss +inf
        q[0] = 0.0
    return p / p.sum(), q / q.sum()


@st.composite
def pwl_curves(draw) -> fdp.PiecewiseLinearCurve:
    p, q = draw(discrete_pairs())
    if draw(st.booleans()):  # a 2-fold composition: product distributions
        p2, q2 = draw(discrete_pairs(max_k=4))
        p, q = np.outer(p, p2).ravel(), np.outer(q, q2).ravel()
    losses, masses, p_inf = _pair_atoms(p, q)
    return fdp.PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses, p_inf=p_inf)


@st.composite
def gaussian_curves(draw) -> fdp.GaussianCurve:
    mu1 = draw(st.floats(0.05, 4.0))
    if draw(st.booleans()):  # G_mu1 (x) G_mu2 = G_sqrt(mu1^2 + mu2^2) (DRS Cor. 3.3)
        mu2 = draw(st.floats(0.05, 4.0))
        return fdp.gaussian_curve(float(np.hypot(mu1, mu2)))
    return fdp.gaussian_curve(mu1)


@st.composite
def eps_delta_curves(draw) -> fdp.PiecewiseLinearCurve:
    n = draw(st.integers(1, 3))
    eps = draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))
    dlt = draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n))
    return fdp.epsilon_delta_curve(eps, dlt)


@st.composite
def subsampled_curves(draw) -> fdp.TradeoffCurve:
    base = draw(st.one_of(gaussian_curves(), pwl_curves()))
    p = draw(st.floats(0.05, 1.0))
    direction = draw(st.sampled_from(["remove", "add"]))
    return base.subsampled(p, direction=direction)


any_curve = st.one_of(gaussian_curves(), pwl_curves(), eps_delta_curves(), subsampled_curves())


def assert_tradeoff_function(f: fdp.TradeoffCurve, tol: float = 1e-9) -> None:
    beta = f(GRID)
    assert np.all((beta >= 0.0) & (beta <= 1.0))
    assert np.all(beta <= 1.0 - GRID + 1e-12), "f <= Id"
    assert np.all(np.diff(beta) <= 1e-12), "non-increasing"
    assert np.all(np.diff(beta, 2) >= -tol), "convex (second differences on a uniform grid)"


# ------------------------------------------------------------------ properties
@FAST
@given(any_curve)
def test_every_curve_is_a_tradeoff_function(f):
    assert_tradeoff_function(f)
    assert_tradeoff_function(f.inverse())


@settings(max_examples=examples(10), deadline=None)
@given(any_curve)
def test_inverse_is_an_involution(f):
    # Numerical double inversion (bisection on a bisection), not the shortcut
    # f.inverse().inverse() is f; for polygons also the exact vertex swap.
    twice = InverseCurve(base=InverseCurve(base=f))
    coarse = GRID[::8]
    np.testing.assert_allclose(twice(coarse), f(coarse), atol=1e-9)
    np.testing.assert_allclose(f.inverse().inverse()(GRID), f(GRID), atol=1e-12)


@FAST
@given(any_curve)
def test_inverse_is_the_reflection_in_the_diagonal(f):
    # f^-1(f(a)) <= a, with equality where f is strictly decreasing at a.
    inv = f.inverse()
    beta = f(GRID)
    back = inv(beta)
    assert np.all(back <= GRID + 1e-9)
    strict = (beta > 1e-6) & (GRID > 0)
    np.testing.assert_allclose(back[strict], GRID[strict], atol=1e-6)


@FAST
@given(any_curve)
def test_symmetrized_is_symmetric_convex_and_below_both(f):
    g = f.symmetrized()
    assert_tradeoff_function(g)
    inv = f.inverse()
    assert np.all(g(GRID) <= f(GRID) + 1e-12)
    assert np.all(g(GRID) <= inv(GRID) + 1e-9)
    np.testing.assert_allclose(g.inverse()(GRID), g(GRID), atol=1e-9)


@FAST
@given(
    st.one_of(gaussian_curves(), pwl_curves(), eps_delta_curves()),
    st.floats(0.01, 1.0),
    st.floats(0.01, 1.0),
)
def test_subsampling_lies_between_f_and_id_and_is_monotone_in_p(f, p1, p2):
    lo_p, hi_p = sorted((p1, p2))
    f_lo, f_hi = f.subsampled(lo_p), f.subsampled(hi_p)
    b, b_lo, b_hi = f(GRID), f_lo(GRID), f_hi(GRID)
    assert np.all(b <= b_hi + 1e-12) and np.all(b_hi <= b_lo + 1e-12)
    assert np.all(b_lo <= 1.0 - GRID + 1e-12)
    # p f + (1-p) Id, pointwise (the definition, DRS subsampling section)
    np.testing.assert_allclose(b_lo, lo_p * b + (1 - lo_p) * (1 - GRID), atol=1e-12)
    # add direction is the inverse of the remove direction
    np.testing.assert_allclose(f.subsampled(lo_p, direction="add")(GRID), f_lo.inverse()(GRID), atol=1e-9)


@FAST
@given(any_curve)
def test_delta_to_curve_to_delta_round_trip(f):
    # f_grid = sup over grid lines of 1 - delta(eps_i) - e^eps_i alpha, so
    # f_grid <= f and delta_{f_grid}(eps_i) = delta_f(eps_i) exactly at grid points.
    grid = np.linspace(0.0, 6.0, 61)
    f_grid = fdp.from_delta(f.delta, epsilons=grid, symmetric=False)
    np.testing.assert_allclose(f_grid.delta(grid), f.delta(grid), rtol=0, atol=1e-9)
    assert np.all(f_grid(GRID) <= f(GRID) + 1e-9)


@FAST
@given(st.floats(0.1, 10.0), st.lists(st.floats(0.0, 30.0), min_size=1, max_size=8))
def test_generic_conjugate_matches_gaussian_closed_form(mu, eps):
    """delta(eps) = 1 + f*(-e^eps) computed numerically vs DRS Cor. 2.13."""
    eps = np.array(eps)
    g = fdp.gaussian_curve(mu)
    closed = mu_gdp_delta_reference(eps, mu)
    np.testing.assert_allclose(conjugate_delta(g, eps), closed, rtol=0, atol=1e-12)
    np.testing.assert_allclose(g.delta(eps), closed, rtol=0, atol=1e-12)


def mu_gdp_delta_reference(eps: np.ndarray, mu: float) -> np.ndarray:
    """Naive float evaluation Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (fine to 1e-12 abs)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = ndtr(-eps / mu + mu / 2) - np.exp(eps) * ndtr(-eps / mu - mu / 2)
    return np.nan_to_num(np.clip(out, 0, 1))


@FAST
@given(st.one_of(pwl_curves(), eps_delta_curves()), st.lists(st.floats(0.0, 8.0), min_size=1, max_size=8))
def test_generic_conjugate_matches_exact_polygon_delta(f, eps):
    eps = np.array(eps)
    np.testing.assert_allclose(conjugate_delta(f, eps), f.delta(eps), rtol=0, atol=1e-12)


@settings(max_examples=examples(15), deadline=None)
@given(any_curve, st.floats(1e-9, 0.5))
def test_epsilon_is_the_smallest_eps_meeting_delta(f, delta):
    eps = f.epsilon(delta)
    if np.isinf(eps):
        assert f.delta(EPS_MAX) > delta
        return
    assert f.delta(eps) <= delta * (1 + 1e-9) + 1e-15
    if eps > 0:
        smaller = max(eps * (1 - 1e-6) - 1e-9, 0.0)
        assert f.delta(smaller) > delta * (1 - 1e-9)


EPS_MAX = 1000.0


def test_epsilon_is_vectorised_and_generic_matches_exact():
    f = fdp.gaussian_curve(1.3).subsampled(0.3)
    deltas = np.array([1e-2, 1e-5, 1e-9])
    generic = fdp.TradeoffCurve.epsilon(f, deltas)  # SubsampledCurve: numeric path
    exact = f.to_piecewise_linear(num_points=4097, side="upper").epsilon(deltas)
    assert generic.shape == (3,)
    # the upper polygon is >= f, so its delta and epsilon are <= the true ones
    assert np.all(exact <= generic + 1e-9)
    np.testing.assert_allclose(generic, exact, rtol=1e-4)


# ---------------------------------------------------------- privacy-loss atoms
def hockey_stick(losses, masses, p_inf, eps):
    """Direct sum sum_k m_k (1 - e^{eps - l_k})_+ + p_inf (docs/accountant.md, equation (1))."""
    losses, masses = np.asarray(losses, float), np.asarray(masses, float)
    eps = np.atleast_1d(eps)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        terms = masses * -np.expm1(np.minimum(eps - losses, 0.0))
    return np.nansum(terms, axis=1) + p_inf


@settings(max_examples=examples(40), deadline=None)
@given(discrete_pairs(), st.lists(st.floats(0.0, 6.0), min_size=1, max_size=6))
def test_atoms_curve_delta_equals_hockey_stick_sum(pair, eps):
    losses, masses, p_inf = _pair_atoms(*pair)
    f = fdp.PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses, p_inf=p_inf)
    np.testing.assert_allclose(f.delta(eps), hockey_stick(losses, masses, p_inf, eps), rtol=1e-10, atol=1e-15)


def test_atoms_keep_relative_accuracy_for_tiny_delta():
    # Tail atom of P-mass 1e-14 at loss 5: delta(1) = 1e-14 (1 - e^-4) exactly.
    losses = np.array([5.0, 0.5, -0.5])
    m_tail = 1e-14
    rest = 1.0 - m_tail
    # choose the two bulk atoms so that Q sums to 1: a e^-0.5 + b e^0.5 = 1 - m_tail e^-5
    q_rest = 1.0 - m_tail * np.exp(-5.0)
    b = (q_rest - rest * np.exp(-0.5)) / (np.exp(0.5) - np.exp(-0.5))
    masses = np.array([m_tail, rest - b, b])
    f = fdp.PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses)
    want = m_tail * -np.expm1(-4.0)
    assert f.delta(1.0) == pytest.approx(want, rel=1e-9)
    assert f.epsilon(0.5 * want) > 1.0


def test_atoms_tolerate_huge_and_infinite_losses():
    losses = np.array([np.inf, 900.0, 1.0, -1.0, -np.inf])
    m_mid = np.exp(1.0) / (1 + np.exp(1.0)) * 0.9
    masses = np.array([0.05, 0.05, m_mid, 0.9 - m_mid, 0.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        f = fdp.PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses)
        d = f.delta(np.array([0.0, 2.0, 50.0, 800.0]))
    # l = 900: Q-mass e^-900 * 0.05 underflows; the atom acts like +inf up to 1e-392.
    want = hockey_stick(losses[1:4], masses[1:4], 0.05, [0.0, 2.0, 50.0, 800.0])
    np.testing.assert_allclose(d, want, rtol=1e-12)
    assert f(0.0) == pytest.approx(0.9, abs=1e-15)


@pytest.mark.parametrize("eps0", [0.1, 1.0, 3.0])
def test_randomized_response_atoms_give_the_pure_dp_curve(eps0):
    """RR: P = (e^e0, 1)/(1 + e^e0), Q reversed; losses +-e0. Its curve is f_{e0, 0} (DRS Prop. 2.5)."""
    p = np.exp(eps0) / (1 + np.exp(eps0))
    f = fdp.PiecewiseLinearCurve.from_privacy_loss_atoms([eps0, -eps0], [p, 1 - p])
    g = fdp.epsilon_delta_curve(eps0, 0.0)
    alpha = np.concatenate([GRID, f.alpha, g.alpha])
    np.testing.assert_allclose(f(alpha), g(alpha), atol=1e-15)
    # single kink at alpha = beta = 1/(1 + e^e0)
    kink = 1 / (1 + np.exp(eps0))
    np.testing.assert_allclose(g.alpha, [0.0, kink, 1.0], atol=1e-15)
    np.testing.assert_allclose(g.beta, [1.0, kink, 0.0], atol=1e-15)
    # delta(eps) = P(L = e0)(1 - e^{eps - e0}) for eps <= e0, so eps(d) = e0 + log(1 - d/p)
    for d in (1e-9, 0.01):
        assert f.epsilon(d) == pytest.approx(eps0 + np.log1p(-d / p), rel=1e-12)
    assert f.delta(eps0) == pytest.approx(0.0, abs=1e-16)


def test_composed_randomized_response_matches_binomial_hockey_stick():
    """T-fold RR: the loss is e0 (T - 2K) with K ~ Bin(T, 1 - p), mass C(T,K) p^(T-K) (1-p)^K."""
    from scipy.stats import binom

    eps0, steps = 0.5, 10
    p = np.exp(eps0) / (1 + np.exp(eps0))
    k = np.arange(steps + 1)
    losses = eps0 * (steps - 2 * k)
    masses = binom.pmf(k, steps, 1 - p)
    f = fdp.PiecewiseLinearCurve.from_privacy_loss_atoms(losses, masses)
    eps = np.linspace(0, 5, 11)
    np.testing.assert_allclose(f.delta(eps), hockey_stick(losses, masses, 0.0, eps), rtol=1e-10, atol=1e-16)
    assert f.symmetrized().dominates(f) and f.dominates(f.symmetrized())  # RR is symmetric


def test_polygon_operations_are_exact_vertex_arithmetic():
    f = fdp.PiecewiseLinearCurve(alpha=[0.0, 0.1, 0.4, 1.0], beta=[0.8, 0.4, 0.1, 0.0])
    inv = f.inverse()
    np.testing.assert_allclose(inv.alpha, [0.0, 0.1, 0.4, 0.8, 1.0])
    np.testing.assert_allclose(inv.beta, [1.0, 0.4, 0.1, 0.0, 0.0])
    fp = f.subsampled(0.5)
    np.testing.assert_allclose(fp(f.alpha), 0.5 * f.beta + 0.5 * (1 - f.alpha))
    # delta: max over vertices of 1 - beta_k - e^eps alpha_k
    eps = np.array([0.0, 1.0, 3.0])
    want = np.max(1 - f.beta[None, :] - np.exp(eps)[:, None] * f.alpha[None, :], axis=1)
    np.testing.assert_allclose(f.delta(eps), want, atol=1e-15)


# ------------------------------------------------------------------ Gaussian
def test_gaussian_curve_values_and_symmetry():
    g = fdp.gaussian_curve(mu=1.0)
    assert isinstance(g(0.3), float)
    assert g(0.0) == 1.0 and g(1.0) == 0.0
    a = np.array([[0.1, 0.2], [0.5, 0.9]])
    assert g(a).shape == (2, 2)
    np.testing.assert_allclose(g(a), ndtr(ndtri(1 - a) - 1.0), rtol=1e-12)
    np.testing.assert_allclose(InverseCurve(base=g)(GRID), g(GRID), atol=1e-12)
    assert fdp.gaussian_curve(0.0).dominates(fdp.identity_curve()) and fdp.identity_curve().dominates(
        fdp.gaussian_curve(0.0)
    )


def test_gaussian_delta_is_stable_at_large_epsilon():
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        for mu in (0.1, 1.0, 10.0, 40.0):
            d = fdp.gaussian_curve(mu).delta(np.array([0.0, 1.0, 30.0, 300.0, 700.0]))
            assert np.all(np.isfinite(d)) and np.all(np.diff(d) <= 0)
    assert fdp.gaussian_curve(10.0).delta(30.0) > 0.9  # mu = 10 is weak privacy


def test_gaussian_epsilon_round_trip():
    g = fdp.gaussian_curve(0.8)
    deltas = np.array([1e-3, 1e-6, 1e-12])
    eps = g.epsilon(deltas)
    np.testing.assert_allclose(gaussian_delta(eps, 0.8), deltas, rtol=1e-9)
    assert np.all(gaussian_delta(eps, 0.8) <= deltas)


def test_from_delta_of_gaussian_recovers_the_gaussian():
    g = fdp.gaussian_curve(1.0)
    f = fdp.from_delta(g.delta)
    alpha = np.concatenate([GRID, np.geomspace(1e-10, 1e-3, 20)])
    assert np.all(f(alpha) <= g(alpha) + 1e-15), "finite grid errs on the safe side"
    np.testing.assert_allclose(f(alpha), g(alpha), atol=2e-6)
    # delta -> f -> delta at 1e-9 on a fine grid; exact at grid points.
    fine = np.linspace(0.0, 10.0, 20001)
    f_fine = fdp.from_delta(g.delta, epsilons=fine)
    np.testing.assert_allclose(f_fine.delta(fine), g.delta(fine), rtol=0, atol=1e-12)
    # Between grid points the recovered delta is the linear interpolation of the
    # grid values in y = e^eps (delta = 1 + f*(-y) is convex in y and f_grid*
    # is the convex hull of the grid points), hence >= delta, by at most
    # (dy)^2/8 max|d2 delta/dy2| ~ 1e-8 here.
    between = (fine[:-1] + fine[1:]) / 2
    d_between = f_fine.delta(between)
    y, yb = np.exp(fine), np.exp(between)
    interp = g.delta(fine[:-1]) + (g.delta(fine[1:]) - g.delta(fine[:-1])) * (yb - y[:-1]) / (y[1:] - y[:-1])
    np.testing.assert_allclose(d_between, interp, rtol=0, atol=1e-12)
    assert np.all(d_between >= g.delta(between) - 1e-15)
    np.testing.assert_allclose(d_between, g.delta(between), rtol=0, atol=2e-8)


def test_from_delta_accepts_scalar_only_callables():
    calls = []

    def scalar_delta(e):
        calls.append(e)
        return float(fdp.gaussian_curve(1.0).delta(float(e)))

    f = fdp.from_delta(scalar_delta, epsilons=[0.0, 1.0, 2.0])
    assert f.delta(1.0) == pytest.approx(fdp.gaussian_curve(1.0).delta(1.0), abs=1e-15)


def test_subsampled_gaussian_symmetrization_matches_drs_closed_form():
    """DRS (subsampling section, operator C_p) for symmetric f with f_p = p f + (1-p) Id:

    min{f_p, f_p^-1}** = f_p on [0, x*], the line of slope -1 on [x*, f_p(x*)],
    f_p^-1 on [f_p(x*), 1], where f_p'(x*) = -1, i.e. f'(x*) = -1. For G_mu,
    f'(x) = -exp(mu z - mu^2/2) with z = Phi^-1(1 - x), so x* = Phi(-mu/2).
    """
    mu, p = 1.5, 0.2
    fp = SubsampledCurve(base=fdp.gaussian_curve(mu), sampling_rate=p)
    xs = ndtr(-mu / 2)
    ys = float(fp(xs))
    a = GRID
    want = np.where(a <= xs, fp(a), np.where(a <= ys, ys + xs - a, fp.inverse()(np.clip(a, 0, 1))))
    got = fp.symmetrized()(a)
    assert np.all(got <= want + 1e-12)
    np.testing.assert_allclose(got, want, atol=1e-6)


# ---------------------------------------------------------------- parametric
def _gaussian_parametric(mu: float) -> fdp.ParametricCurve:
    # alpha(t) = Phi(-t/mu - mu/2), beta(t) = Phi(t/mu - mu/2): the seed's Lemma with Z = mu.
    return fdp.ParametricCurve(
        alpha_of_t=lambda t: ndtr(-t / mu - mu / 2),
        beta_of_t=lambda t: ndtr(t / mu - mu / 2),
        one_minus_beta_of_t=lambda t: ndtr(-t / mu + mu / 2),
    )


def test_parametric_gaussian_equals_closed_form():
    for mu in (0.3, 2.0):
        par, g = _gaussian_parametric(mu), fdp.gaussian_curve(mu)
        np.testing.assert_allclose(par(GRID), g(GRID), atol=1e-13)
        eps = np.array([0.0, 0.5, 2.0, 10.0])
        np.testing.assert_allclose(par.delta(eps), g.delta(eps), rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(par.inverse()(GRID), g(GRID), atol=1e-13)


def test_parametric_seed_lemma_with_two_point_z():
    """Seed Lemma: Z random, f(alpha(t)) = beta(t) with alpha = E[Phi(-t/Z - Z/2)], beta = E[Phi(t/Z - Z/2)].

    Given Z = z the pair is a Gaussian pair with mu = z, and Z is observed, so
    delta(eps) = E_Z[delta_Gauss(eps; Z)] (docs/jl.md, "The mechanism"). Independent
    of the parametric machinery.
    """
    z = np.array([0.5, 2.0])
    w = np.array([0.7, 0.3])

    def alpha(t):
        t = np.asarray(t, float)[..., None]
        return np.sum(w * ndtr(-t / z - z / 2), axis=-1)

    def beta(t):
        t = np.asarray(t, float)[..., None]
        return np.sum(w * ndtr(t / z - z / 2), axis=-1)

    def one_minus_beta(t):
        t = np.asarray(t, float)[..., None]
        return np.sum(w * ndtr(-t / z + z / 2), axis=-1)

    f = fdp.ParametricCurve(alpha_of_t=alpha, beta_of_t=beta, one_minus_beta_of_t=one_minus_beta)
    eps = np.array([0.0, 0.3, 1.0, 3.0, 8.0])
    want = w[0] * gaussian_delta(eps, z[0]) + w[1] * gaussian_delta(eps, z[1])
    np.testing.assert_allclose(f.delta(eps), want, rtol=1e-9, atol=1e-15)
    t = np.array([-2.0, 0.0, 1.5])
    np.testing.assert_allclose(f(alpha(t)), beta(t), atol=1e-12)
    # generic conjugate through root-finding agrees
    np.testing.assert_allclose(conjugate_delta(f, eps), want, rtol=0, atol=1e-12)
    assert_tradeoff_function(f)
    # the mixture is weaker than G_0.5 and stronger than G_2 (post-processing / mixing)
    assert f.dominates(fdp.gaussian_curve(2.0)) and fdp.gaussian_curve(0.5).dominates(f)


# ----------------------------------------------------------- comparison, misc
def test_dominates():
    g1, g2 = fdp.gaussian_curve(1.0), fdp.gaussian_curve(2.0)
    assert g1.dominates(g2) and not g2.dominates(g1)
    rr1, rr2 = fdp.epsilon_delta_curve(1.0, 0.0), fdp.epsilon_delta_curve(2.0, 0.0)
    assert rr1.dominates(rr2) and not rr2.dominates(rr1)
    assert fdp.identity_curve().dominates(g1)
    f = g1.subsampled(0.3)
    assert f.dominates(f.symmetrized())
    # a violation at a single vertex between grid points is caught (vertices are checked)
    kink = fdp.PiecewiseLinearCurve(alpha=[0.0, 0.123456789, 1.0], beta=[1.0, 0.75, 0.0])
    flat = fdp.PiecewiseLinearCurve(alpha=[0.0, 0.123456789, 1.0], beta=[1.0, 0.75 + 1e-7, 0.0])
    assert flat.dominates(kink) and not kink.dominates(flat)


def test_convex_minimum_is_below_both_and_exact_for_polygons():
    f = fdp.epsilon_delta_curve(1.0, 0.0)
    g = fdp.epsilon_delta_curve(0.2, 0.1)
    m = convex_minimum(f, g)
    assert np.all(m(GRID) <= np.minimum(f(GRID), g(GRID)) + 1e-15)
    both = fdp.epsilon_delta_curve([1.0, 0.2], [0.0, 0.1])  # max of curves, for contrast
    assert both.dominates(f) and both.dominates(g)
    assert f.dominates(m) and g.dominates(m)


def test_plot_smoke():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = fdp.gaussian_curve(1.0).plot(label="G_1")
    fdp.gaussian_curve(1.0).subsampled(0.1).symmetrized().plot(ax=ax, label="subsampled")
    assert len(ax.lines) == 4
    assert ax.get_xlabel().startswith("type I")
    plt.close(ax.figure)


def test_curves_are_immutable():
    g = fdp.gaussian_curve(1.0)
    with pytest.raises(AttributeError):
        g.mu = 2.0  # type: ignore[misc]
    f = fdp.identity_curve()
    with pytest.raises(ValueError):
        f.alpha[0] = 0.5
