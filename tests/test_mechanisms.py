"""Laplace, randomized response, FromDistributions and FromDelta against the maths.

Every reference value is computed here from a formula (closed forms derived in
the docstrings below, exact binomial sums or quadrature in mpmath at 30
digits), or by a peer library run live (dp_accounting, skipped when absent).
"""

from __future__ import annotations

import json
import math
import warnings

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate, stats

import fdp
from fdp.mechanisms.from_delta import NonConvexProfileWarning
from fdp.mechanisms.profile_pairs import first_nonconvex_point, lower_profile, symmetric_pair_from_curve
from fdp.mechanisms.gaussian import subsampled_gaussian_delta
from fdp.pld.cells import Direction, Grid
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic
from fdp.tradeoff.base import conjugate_delta
from fdp.tradeoff.gaussian import gaussian_delta

mp.mp.dps = 30


# ----------------------------------------------------------------- helpers
def pair_delta(p_mass: np.ndarray, q_mass: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Hockey stick sum_i (P_i - e^eps Q_i)_+ of a discrete pair, for each eps."""
    eps = np.atleast_1d(np.asarray(eps, dtype=np.float64))
    return np.clip(p_mass[None, :] - np.exp(eps)[:, None] * q_mass[None, :], 0.0, None).sum(axis=1)


def subsampled_pairs(p0: np.ndarray, p1: np.ndarray, p: float) -> dict[Direction, tuple[np.ndarray, np.ndarray]]:
    """(P, Q) of both neighbouring relations (docs/accountant.md, "What it computes")."""
    mix = (1 - p) * p0 + p * p1
    return {Direction.REMOVE: (mix, p0), Direction.ADD: (p0, mix)}


def bisect_mp(fn, lo, hi, iters=200):
    """Root of a monotone function with fn(lo), fn(hi) of opposite signs (mpmath)."""
    flo = fn(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (fn(mid) > 0) == (flo > 0):
            lo, flo = mid, fn(mid)
        else:
            hi = mid
    return (lo + hi) / 2


def laplace_exact_delta(eps: float, b: float, p: float, direction: Direction) -> float:
    """Exact delta(eps) of one subsampled Laplace step, from the densities (mpmath).

    P0 = Lap(0, b), P1 = Lap(1, b). The likelihood ratio is constant on
    x <= 0 and on x >= 1 (two atoms with masses from the Laplace CDF) and
    monotone on (0, 1), so P - e^eps Q changes sign at most once there: find
    the sign change by bisection and integrate the positive part.
    """
    b, p, e = mp.mpf(b), mp.mpf(p), mp.exp(mp.mpf(eps))
    f0 = lambda x: mp.exp(-abs(x) / b) / (2 * b)  # noqa: E731
    f1 = lambda x: mp.exp(-abs(x - 1) / b) / (2 * b)  # noqa: E731
    a0, a1 = mp.mpf(1) / 2, mp.exp(-1 / b) / 2  # P0, P1 of x <= 0
    b0, b1 = mp.exp(-1 / b) / 2, mp.mpf(1) / 2  # P0, P1 of x >= 1
    if direction is Direction.REMOVE:
        dens = lambda x: (1 - p) * f0(x) + p * f1(x) - e * f0(x)  # noqa: E731
        atoms = [(1 - p) * a0 + p * a1 - e * a0, (1 - p) * b0 + p * b1 - e * b0]
    else:
        dens = lambda x: f0(x) - e * ((1 - p) * f0(x) + p * f1(x))  # noqa: E731
        atoms = [a0 - e * ((1 - p) * a0 + p * a1), b0 - e * ((1 - p) * b0 + p * b1)]
    total = sum(max(a, 0) for a in atoms)
    lo, hi = mp.mpf(0), mp.mpf(1)
    s_lo, s_hi = dens(lo), dens(hi)
    if s_lo > 0 and s_hi > 0:
        total += mp.quad(dens, [lo, hi])
    elif (s_lo > 0) != (s_hi > 0):
        root = bisect_mp(dens, lo, hi)
        total += mp.quad(dens, [lo, root] if s_lo > 0 else [root, hi])
    return float(total)


# ----------------------------------------------------------------- Laplace
def laplace_np_curve(b: float, alpha: np.ndarray) -> np.ndarray:
    """Brute-force Neyman-Pearson curve of binned (Lap(0,b), Lap(1,b)).

    x is cut into bins (edges include 0 and 1, tails to +-inf); the binned pair
    is a post-processing of the true one, so its curve is >= the exact curve.
    Tests: sort bins by P1/P0 decreasing, alpha = cumulative P0, beta = 1 -
    cumulative P1, interpolate.
    """
    inner = np.linspace(0.0, 1.0, 4001)
    outer = np.linspace(0.0, 40 * b, 4001)[1:]
    edges = np.concatenate([[-np.inf], -outer[::-1], inner, 1 + outer, [np.inf]])
    m0 = np.diff(stats.laplace.cdf(edges, loc=0.0, scale=b))
    m1 = np.diff(stats.laplace.cdf(edges, loc=1.0, scale=b))
    with np.errstate(divide="ignore", invalid="ignore"):  # empty far-tail bins: nan, sorted last
        order = np.argsort(-(np.log(m1) - np.log(m0)), kind="stable")
    a = np.concatenate([[0.0], np.cumsum(m0[order])])
    beta = np.concatenate([[1.0], 1.0 - np.cumsum(m1[order])])
    return np.interp(alpha, a, np.clip(beta, 0.0, 1.0))


@pytest.mark.parametrize("b", [0.3, 1.0, 4.0])
def test_laplace_curve_matches_brute_force_neyman_pearson(b):
    f = fdp.Laplace(scale=b).tradeoff()
    alpha = np.concatenate([np.linspace(0.0, 1.0, 401), [0.5 * math.exp(-1 / b), 0.5]])
    exact = f(alpha)
    brute = laplace_np_curve(b, alpha)
    assert np.all(brute >= exact - 1e-9)  # binning is a post-processing
    assert np.max(brute - exact) < 2e-4
    assert f.inverse() is f and fdp.Laplace(scale=b).is_symmetric()


@pytest.mark.parametrize("b", [0.3, 1.0, 4.0])
def test_laplace_curve_delta_is_its_conjugate(b):
    """Closed form (4) = sup_alpha (1 - f(alpha) - e^eps alpha), taken numerically."""
    f = fdp.laplace_curve(1 / b)
    eps = np.linspace(0.0, 1.2 / b, 25)
    closed = np.maximum(0.0, 1.0 - np.exp((eps - 1 / b) / 2))
    assert np.allclose(f.delta(eps), closed, atol=1e-14)
    assert np.allclose(conjugate_delta(f, eps), closed, atol=1e-12)
    d = np.array([1e-3, 0.05, 0.2])
    assert np.allclose(f.epsilon(d), np.maximum(0.0, 1 / b + 2 * np.log1p(-d)), rtol=1e-9)


@pytest.mark.parametrize("b", [0.5, 2.0, 10.0])
def test_laplace_single_step_delta_brackets_closed_form(b):
    """delta(eps) = max(0, 1 - e^{(eps - 1/b)/2}) (module fdp.mechanisms.laplace, eq. (4))."""
    acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=b), 1)
    h = acc.composed_pld().h
    for eps in np.array([0.0, 0.13, 0.4, 0.77, 0.99]) / b:
        lo, hi = acc.get_delta_bounds(eps)
        exact = max(0.0, -math.expm1((eps - 1 / b) / 2))
        assert lo <= exact + 1e-15 and exact <= hi + 1e-15
        # connect-the-dots splits the top atom (mass 1/2) over one cell: error <= h/8,
        # plus O(h^2) from the continuous part
        assert hi - exact <= h / 8 + h * h


@pytest.mark.parametrize("p", [1.0, 0.3])
@pytest.mark.parametrize("direction", list(Direction))
def test_laplace_cells_bracket_exact_subsampled_delta(p, direction):
    """Pessimistic >= exact >= optimistic for every eps (off the grid, negative eps too)."""
    mech = fdp.Laplace(scale=1.5, sampling_rate=p)
    lo, hi = mech.loss_range(direction, 1e-15)
    cells = mech.loss_cells(direction, Grid.covering(lo, hi, 0.005), pessimistic=True)
    assert cells.total_mass == pytest.approx(1.0, abs=1e-13)
    pess, opt = discretise_pessimistic(cells), discretise_optimistic(cells)
    eps = np.linspace(lo - 0.05, hi - 1e-3, 13)
    exact = np.array([laplace_exact_delta(e, 1.5, p, direction) for e in eps])
    assert np.all(pess.delta(eps) >= exact - 1e-13)
    assert np.all(opt.delta(eps) <= exact + 1e-13)
    # near an atom of mass m the split over one cell costs up to m h / 4 (here m <= 1/2)
    assert np.max(pess.delta(eps) - exact) < 0.005 / 8 + 1e-6
    # a grid covering only the middle of the range: tails are charged on the safe sides
    short = mech.loss_cells(direction, Grid.covering(0.5 * lo, 0.5 * hi, 0.005), pessimistic=True)
    assert short.p_left > 0.1 and short.p_right > 0.1
    assert short.total_mass == pytest.approx(1.0, abs=1e-13)
    assert np.all(discretise_pessimistic(short).delta(eps) >= exact - 1e-13)
    assert np.all(discretise_optimistic(short).delta(eps) <= exact + 1e-13)


def _laplace_delta1(e: float, mu: float) -> float:
    """delta of one unsubsampled step at any real eps (derivation in laplace_delta_composed)."""
    if e <= -mu:
        return -math.expm1(e)
    if e >= mu:
        return 0.0
    return -math.expm1((e - mu) / 2)


def laplace_delta_composed(eps: float, mu: float, steps: int, *, high_precision: bool = True) -> float:
    """Exact delta of ``steps`` unsubsampled Laplace steps by recursion over the loss law.

    The remove loss L = g(X), X ~ Lap(1, b), has atoms +mu (mass 1/2, x >= 1)
    and -mu (mass e^{-mu}/2, x <= 0) and on (-mu, mu) the density of
    g = (2x - 1)/b: x = (b g + 1)/2, density e^{(x-1)/b}/(2b) * b/2 =
    e^{(g - mu)/2}/4. delta_1(e) = E[(1 - e^{e - L})_+] integrates to
    1 - e^{(e - mu)/2} on |e| <= mu, 1 - e^e below -mu, 0 above mu, and
    delta_k(e) = E[delta_{k-1}(e - L)] (independent losses add). Quadrature
    with the kinks e - g = +-mu as break points: the outer integral in mpmath
    (30 digits) when ``high_precision``, inner levels with scipy (~1e-13).
    """
    if steps == 1:
        return _laplace_delta1(eps, mu)

    def inner(e: float) -> float:
        return laplace_delta_composed(e, mu, steps - 1, high_precision=False)

    atoms = 0.5 * inner(eps - mu) + 0.5 * math.exp(-mu) * inner(eps + mu)
    brk = sorted({-mu, mu, *[t for t in (eps - mu, eps + mu) if -mu < t < mu]})
    if high_precision:
        dens_mp = lambda g: mp.mpf(0.25) * mp.exp((g - mu) / 2) * mp.mpf(inner(float(eps - g)))  # noqa: E731
        cont = float(mp.quad(dens_mp, brk))
    else:
        dens = lambda g: 0.25 * math.exp((g - mu) / 2) * inner(eps - g)  # noqa: E731
        cont = integrate.quad(dens, -mu, mu, points=brk[1:-1], epsabs=1e-14, epsrel=1e-13, limit=200)[0]
    return atoms + cont


def test_laplace_delta_composed_reference_is_consistent():
    """The reference's loss law has total mass 1 and reproduces delta_1 at one step."""
    mu = 0.8
    mass = 0.5 + 0.5 * math.exp(-mu) + integrate.quad(lambda g: 0.25 * math.exp((g - mu) / 2), -mu, mu)[0]
    assert mass == pytest.approx(1.0, abs=1e-14)
    f = fdp.laplace_curve(mu)
    for e in (0.0, 0.3, 0.7):
        assert laplace_delta_composed(e, mu, 1) == pytest.approx(float(f.delta(e)), abs=1e-15)
    # the two quadratures agree at two steps
    for e in (0.1, 0.9):
        assert laplace_delta_composed(e, mu, 2) == pytest.approx(
            laplace_delta_composed(e, mu, 2, high_precision=False), abs=1e-12)


@pytest.mark.parametrize("b,steps", [(1.0, 2), (2.5, 3)])
def test_laplace_composition_brackets_exact_reference(b, steps):
    acc = fdp.PLDAccountant(grid_spacing=2e-3).compose(fdp.Laplace(scale=b), steps)
    for eps in (0.0, 0.4 / b, 1.3 / b):
        exact = laplace_delta_composed(eps, 1 / b, steps)
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact + 1e-12 and exact <= hi + 1e-12
        assert hi - lo < 1e-2 * max(exact, 1e-2)


@pytest.mark.parametrize("p,steps", [(1.0, 40), (0.2, 60)])
def test_laplace_composition_vs_dp_accounting(p, steps):
    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    b, delta = 3.0, 1e-6
    theirs = pld_mod.from_laplace_mechanism(
        b, sensitivity=1.0, sampling_prob=p, value_discretization_interval=1e-4, use_connect_dots=True,
    ).self_compose(steps).get_epsilon_for_delta(delta)  # pessimistic: >= the truth, both directions
    lo, hi = fdp.PLDAccountant().compose(fdp.Laplace(scale=b, sampling_rate=p), steps).get_epsilon_bounds(delta)
    assert lo <= theirs <= hi * (1 + 1e-4)  # both pessimistic connect-the-dots: close
    assert (hi - lo) / hi <= 5e-3


def test_laplace_subsampled_directions_both_accounted():
    """With p < 1 the accountant reports the worse direction; each brackets its exact delta."""
    mech = fdp.Laplace(scale=1.0, sampling_rate=0.25)
    acc = fdp.PLDAccountant(grid_spacing=1e-3).compose(mech, 1)
    for eps in (0.02, 0.1, 0.2):
        exact = {d: laplace_exact_delta(eps, 1.0, 0.25, d) for d in Direction}
        for d in Direction:
            assert acc.composed_pld(d, pessimistic=True).delta(eps) >= exact[d] - 1e-14
            assert acc.composed_pld(d, pessimistic=False).delta(eps) <= exact[d] + 1e-14
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= max(exact.values()) <= hi
    assert exact[Direction.REMOVE] != pytest.approx(exact[Direction.ADD], rel=1e-3)


# --------------------------------------------------------- randomized response
def rr_composed_delta(eps: float, eps0: float, steps: int) -> mp.mpf:
    """Exact delta of ``steps`` randomized responses (mpmath, 30 digits).

    The loss of one step is +eps0 with probability q = e^eps0 / (1 + e^eps0)
    and -eps0 otherwise, so the composed loss is eps0 (2K - T), K ~ Bin(T, q):
    delta(eps) = sum_k C(T, k) q^k (1-q)^{T-k} (1 - e^{eps - eps0 (2k - T)})_+.
    """
    e0 = mp.mpf(eps0)
    q = mp.exp(e0) / (1 + mp.exp(e0))
    total = mp.mpf(0)
    for k in range(steps + 1):
        loss = e0 * (2 * k - steps)
        if loss > eps:
            total += mp.binomial(steps, k) * q**k * (1 - q) ** (steps - k) * (1 - mp.exp(mp.mpf(eps) - loss))
    return total


@pytest.mark.parametrize("eps0,steps", [(0.5, 1), (1.3, 7), (0.2, 40)])
def test_rr_composition_brackets_binomial_closed_form(eps0, steps):
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=eps0), steps)
    for eps in np.array([0.0, 0.3, 0.8]) * eps0 * steps:
        exact = float(rr_composed_delta(eps, eps0, steps))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact * (1 + 1e-12) + 1e-15 and exact <= hi * (1 + 1e-12) + 1e-15
    for delta in (1e-2, 1e-5):
        lo, hi = acc.get_epsilon_bounds(delta)
        # lo <= eps_exact <= hi  <=>  delta_exact(hi) <= delta <= delta_exact(lo)
        assert float(rr_composed_delta(hi, eps0, steps)) <= delta * (1 + 1e-9)
        assert float(rr_composed_delta(lo, eps0, steps)) >= delta * (1 - 1e-9)


@pytest.mark.parametrize("p", [1.0, 0.3, 0.02])
def test_rr_subsampled_single_step_brackets_exact(p):
    mech = fdp.RandomizedResponse(epsilon=1.2, sampling_rate=p)
    p0, p1 = mech.probabilities()
    pairs = subsampled_pairs(p0, p1, p)
    acc = fdp.PLDAccountant(grid_spacing=1e-3).compose(mech, 1)
    for eps in (0.0, 0.01, 0.3, 1.0):
        exact = max(float(pair_delta(*pairs[d], eps)[0]) for d in Direction)
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact + 1e-15 and exact <= hi + 1e-15


def test_rr_bounds_are_exact_on_a_grid_through_the_atoms():
    """With h = eps0 / 20 every composed atom sits on a grid point: no discretisation error."""
    eps0, steps = 1.0, 10
    acc = fdp.PLDAccountant(grid_spacing=eps0 / 20).compose(fdp.RandomizedResponse(epsilon=eps0), steps)
    for eps in (0.0, 2.5, 4.0):
        exact = float(rr_composed_delta(eps, eps0, steps))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo == pytest.approx(exact, rel=1e-10) and hi == pytest.approx(exact, rel=1e-10)


def test_rr_tradeoff_is_the_eps_zero_curve():
    eps0 = 0.9
    f = fdp.RandomizedResponse(epsilon=eps0).tradeoff()
    g = fdp.FromDistributions(*reversed(fdp.RandomizedResponse(epsilon=eps0).probabilities())).tradeoff()
    alpha = np.linspace(0, 1, 301)
    assert np.allclose(f(alpha), np.maximum.reduce([1 - math.exp(eps0) * alpha,
                                                    math.exp(-eps0) * (1 - alpha), 0 * alpha]), atol=1e-15)
    assert np.allclose(f(alpha), g(alpha), atol=1e-12)
    eps = np.linspace(0, 1.5, 16)
    assert np.allclose(f.delta(eps), np.maximum(0, (math.exp(eps0) - np.exp(eps)) / (1 + math.exp(eps0))), atol=1e-15)


def test_rr_large_epsilon_does_not_overflow():
    mech = fdp.RandomizedResponse(epsilon=400.0, sampling_rate=0.5)
    for d in Direction:
        lo, hi = mech.loss_range(d, 1e-15)
        cells = mech.loss_cells(d, Grid.covering(lo, hi, 0.5), pessimistic=True)
        assert np.isfinite(lo) and np.isfinite(hi) and cells.p_inf == 0.0
        assert cells.total_mass == pytest.approx(1.0, abs=1e-14)


# --------------------------------------------------------- FromDistributions
@pytest.mark.parametrize("p", [1.0, 0.3])
def test_from_distributions_equals_rr(p):
    rr = fdp.RandomizedResponse(epsilon=0.8, sampling_rate=p)
    p0, p1 = rr.probabilities()
    fd = fdp.FromDistributions(p1, p0, sampling_rate=p)
    assert fd.is_symmetric()
    a = fdp.PLDAccountant().compose(rr, 12)
    b = fdp.PLDAccountant().compose(fd, 12)
    for delta in (1e-3, 1e-7):
        # the same PLD up to a few ulps in its masses; the FFT path turns that into ~1e-12 of eps
        assert b.get_epsilon_bounds(delta) == pytest.approx(a.get_epsilon_bounds(delta), rel=1e-10, abs=1e-14)


def test_from_distributions_single_step_and_infinite_loss():
    """An outcome with q = 0 < p is distinguishable with certainty: delta(eps) >= p there."""
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.2, 0.3, 0.5, 0.0])
    mech = fdp.FromDistributions(p, q)
    assert not mech.is_symmetric()
    acc = fdp.PLDAccountant(grid_spacing=1e-3).compose(mech, 1)
    for eps in (0.0, 0.5, 0.9, 3.0):
        remove = float(pair_delta(p, q, eps)[0])  # (P, Q) = (p, q)
        exact = max(remove, float(pair_delta(q, p, eps)[0]))  # add: (P, Q) = (q, p)
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact + 1e-15 and exact <= hi + 1e-15 and lo >= 0.05 - 1e-11
        assert float(mech.tradeoff().delta(eps)) == pytest.approx(remove, abs=1e-14)
    # add direction at p = 1: the pair (q, p); its hockey stick is the other way round
    add = acc.composed_pld("add", pessimistic=True)
    assert add.delta(0.2) >= float(pair_delta(q, p, 0.2)[0]) - 1e-15


def test_from_distributions_json_round_trip():
    mech = fdp.FromDistributions([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], sampling_rate=0.1)
    data = mech.to_dict()
    assert data["p_probs"] == [0.5, 0.3, 0.2] and isinstance(data["q_probs"], list)
    acc = fdp.PLDAccountant().compose(mech, 7).compose(fdp.Laplace(scale=2.0), 3).compose(
        fdp.RandomizedResponse(epsilon=0.3, sampling_rate=0.5), 2)
    back = fdp.PLDAccountant.from_json(json.dumps(json.loads(acc.to_json())))
    assert back.events == acc.events
    assert back.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    assert hash(mech) == hash(fdp.FromDistributions((0.5, 0.3, 0.2), (0.2, 0.3, 0.5), sampling_rate=0.1))


@pytest.mark.parametrize(
    "p_probs,q_probs,name",
    [
        ([0.5, -0.1, 0.6], [0.3, 0.3, 0.4], "p_probs"),
        ([0.5, 0.5], [float("nan"), 1.0], "q_probs"),
        ([0.5, float("inf")], [0.5, 0.5], "p_probs"),
        ([0.5, 0.4], [0.5, 0.5], "p_probs"),
        ([0.5, 0.5], [0.5, 0.5 + 1e-6], "q_probs"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], "p_probs and q_probs"),
        ([[0.5, 0.5]], [[0.5, 0.5]], "p_probs"),
        ([], [], "p_probs"),
    ],
)
def test_from_distributions_bad_input(p_probs, q_probs, name):
    with pytest.raises(ValueError, match=name):
        fdp.FromDistributions(p_probs, q_probs)


# ------------------------------------------------------------------ FromDelta
def gdp(mu):
    return lambda e: gaussian_delta(np.asarray(e, dtype=np.float64), mu)


@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 10)])
def test_from_delta_gaussian_brackets_gdp(sigma, steps):
    """Composed mu-GDP is sqrt(T)/sigma-GDP: its exact delta lies inside the bounds."""
    acc = fdp.PLDAccountant().compose(fdp.FromDelta(gdp(1 / sigma)), steps)
    mu_t = math.sqrt(steps) / sigma
    for eps in (0.0, 1.0, 3.0):
        exact = float(gaussian_delta(np.array(eps), mu_t))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact * (1 + 1e-9) + 1e-15 and exact <= hi * (1 + 1e-9) + 1e-15
        assert hi - lo <= 2e-2 * exact + 1e-12


@pytest.mark.parametrize("p", [1.0, 0.2, 0.01])
def test_from_delta_pairs_bracket_subsampled_gaussian_both_directions(p):
    """The discrete pairs themselves (before any grid): pessimistic >= exact >= optimistic."""
    sigma = 0.9
    mech = fdp.FromDelta(gdp(1 / sigma), sampling_rate=p)
    eps = np.linspace(-2.0, 4.0, 61)
    for pessimistic in (True, False):
        lp0, lp1 = mech._log_pair(pessimistic)
        pairs = subsampled_pairs(np.exp(lp0), np.exp(lp1), p)
        for d in Direction:
            exact = subsampled_gaussian_delta(eps, 1 / sigma, p, d)
            ours = pair_delta(*pairs[d], eps)
            if pessimistic:
                assert np.all(ours >= exact - 1e-13)
                assert np.max(ours - exact) < 1e-5
            else:
                assert np.all(ours <= exact + 1e-13)
                assert np.max(exact - ours) < 1e-5


def test_from_delta_subsampled_overlaps_gaussian_mechanism():
    sigma, p, steps, delta = 1.0, 0.05, 200, 1e-6
    a = fdp.PLDAccountant().compose(fdp.FromDelta(gdp(1 / sigma), sampling_rate=p), steps).get_epsilon_bounds(delta)
    b = fdp.PLDAccountant().compose(fdp.Gaussian(sigma, sampling_rate=p), steps).get_epsilon_bounds(delta)
    assert a[0] <= b[1] and b[0] <= a[1]  # both contain the exact epsilon
    assert a[1] == pytest.approx(b[1], rel=3e-3)


def rr_profile(eps0):
    """RR's delta(eps) = max(0, (e^eps0 - e^eps) / (1 + e^eps0)) (fdp.mechanisms.discrete)."""
    return lambda e: np.maximum(0.0, (math.exp(eps0) - np.exp(np.asarray(e, dtype=np.float64))) / (1 + math.exp(eps0)))


def test_from_delta_reproduces_rr_when_its_kink_is_on_the_grid():
    eps0 = 0.75
    mech = fdp.FromDelta(rr_profile(eps0), epsilons=np.linspace(0, 1.5, 41))  # 0.75 on the grid
    rr = fdp.RandomizedResponse(epsilon=eps0)
    alpha = np.linspace(0, 1, 257)
    assert np.allclose(mech.tradeoff()(alpha), rr.tradeoff()(alpha), atol=1e-14)
    for pessimistic in (True, False):
        lp0, lp1 = mech._log_pair(pessimistic)
        eps = np.linspace(-1, 1, 41)
        assert np.allclose(pair_delta(np.exp(lp1), np.exp(lp0), eps),
                           pair_delta(*reversed(rr.probabilities()), eps), atol=1e-14)
    a = fdp.PLDAccountant().compose(mech, 9).get_epsilon_bounds(1e-4)
    b = fdp.PLDAccountant().compose(rr, 9).get_epsilon_bounds(1e-4)
    assert a == pytest.approx(b, rel=1e-9)


def test_from_delta_brackets_rr_when_its_kink_is_off_the_grid():
    eps0, steps = 0.7, 9  # 0.7 is not on the default grid linspace(0, 1, 4097)
    acc = fdp.PLDAccountant().compose(fdp.FromDelta(rr_profile(eps0)), steps)
    for eps in (0.0, 1.5, 4.0):
        exact = float(rr_composed_delta(eps, eps0, steps))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo <= exact + 1e-14 and exact <= hi + 1e-14


def test_from_delta_lower_profile_is_below_a_convex_profile():
    """The secant minorant (1) of fdp.mechanisms.from_delta lies below delta everywhere."""
    mu = 1.3
    grid = np.linspace(0.0, 8.0, 17)
    ev, dv = lower_profile(grid, gaussian_delta(grid, mu))
    assert np.all(dv <= gaussian_delta(ev, mu) + 1e-15)
    assert ev.size > grid.size  # kinks were added
    # a profile that is a single chord (randomized response) is reproduced exactly
    ev, dv = lower_profile(np.linspace(0, 1, 5), rr_profile(0.5)(np.linspace(0, 1, 5)))
    assert np.allclose(dv, rr_profile(0.5)(ev), atol=1e-15)


def test_from_delta_accepts_scalar_callables_and_refuses_serialisation():
    mech = fdp.FromDelta(lambda e: max(0.0, 1.0 - math.exp((e - 1.0) / 2)))  # Laplace, b = 1
    lap = fdp.PLDAccountant().compose(fdp.Laplace(scale=1.0), 4).get_epsilon_bounds(1e-3)
    ours = fdp.PLDAccountant().compose(mech, 4).get_epsilon_bounds(1e-3)
    assert ours[0] <= lap[1] and lap[0] <= ours[1]
    with pytest.raises(ValueError, match="callable"):
        mech.to_dict()
    with pytest.raises(ValueError, match="callable"):
        fdp.PLDAccountant().compose(mech, 1).to_json()


@pytest.mark.parametrize(
    "fn,kwargs,match",
    [
        (lambda e: np.full_like(e, np.nan), {}, "delta_of_epsilon"),
        (lambda e: 1.5 + 0 * e, {}, "delta_of_epsilon"),
        (lambda e: np.minimum(1.0, 0.1 * np.asarray(e)), {}, "non-increasing"),
        (gdp(1.0), {"epsilons": [-1.0, 2.0]}, "epsilons"),
        (gdp(1.0), {"epsilons": [float("nan")]}, "epsilons"),
        (gdp(1.0), {"num_points": 2}, "num_points"),
        (gdp(1.0), {"sampling_rate": 0.0}, "sampling_rate"),
    ],
)
def test_from_delta_bad_input(fn, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fdp.FromDelta(fn, **kwargs)


def test_from_delta_not_callable():
    with pytest.raises(TypeError, match="delta_of_epsilon"):
        fdp.FromDelta(0.5)


# --------------------------------------------------------- shared bad input
@pytest.mark.parametrize(
    "make,name",
    [
        (lambda v: fdp.Laplace(scale=v), "scale"),
        (lambda v: fdp.RandomizedResponse(epsilon=v), "epsilon"),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "1.0", None])
def test_parameter_bad_input(make, name, value):
    with pytest.raises(ValueError, match=name):
        make(value)


def test_laplace_scale_zero_is_refused_and_rr_zero_is_identity():
    with pytest.raises(ValueError, match=r"scale must be in \[1e-300, inf\); got 0"):
        fdp.Laplace(scale=0.0)
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=0.0), 5)
    assert acc.get_delta(0.0) == pytest.approx(0.0, abs=1e-13)


@pytest.mark.parametrize(
    "make",
    [
        lambda r: fdp.Laplace(scale=1.0, sampling_rate=r),
        lambda r: fdp.RandomizedResponse(epsilon=1.0, sampling_rate=r),
        lambda r: fdp.FromDistributions([0.6, 0.4], [0.4, 0.6], sampling_rate=r),
        lambda r: fdp.FromDelta(gdp(1.0), sampling_rate=r),
    ],
)
@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_sampling_rate_bad_input(make, rate):
    with pytest.raises(ValueError, match="sampling_rate"):
        make(rate)


@pytest.mark.parametrize(
    "mech",
    [fdp.Laplace(scale=0.7, sampling_rate=0.3), fdp.RandomizedResponse(epsilon=2.0, sampling_rate=0.9)],
)
def test_json_round_trip(mech):
    from fdp.mechanisms.base import mechanism_from_dict

    back = mechanism_from_dict(json.loads(json.dumps(mech.to_dict())))
    assert back == mech and type(back) is type(mech)


def test_mechanisms_doc_examples_run(capsys):
    """The examples of docs/mechanisms.md run as written and print the values they state."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "mechanisms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 4
    for code in blocks:
        exec(compile(code, "docs/mechanisms.md", "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    assert "exact 0.117503" in out and "f(0.1) = 0.835128" in out
    assert "delta(4): [0.430577, 0.430577], exact 0.430577" in out and "(0.0, 0.0)" in out
    assert "T(q||p)(0.2) = 0.5" in out


@pytest.mark.parametrize("eps0, steps", [(1.0, 10), (0.37, 25)])
def test_automatic_grid_passes_through_the_atoms_so_rr_is_exact(eps0, steps):
    """grid_anchor puts +-eps0 on the grid: both bounds equal the binomial closed form."""
    acc = fdp.PLDAccountant().compose(fdp.RandomizedResponse(epsilon=eps0), steps)
    for eps in (0.5, 2.0):
        exact = float(rr_composed_delta(eps, eps0, steps))
        lo, hi = acc.get_delta_bounds(eps)
        assert lo == pytest.approx(exact, rel=1e-9) and hi == pytest.approx(exact, rel=1e-9)


def test_from_delta_lower_bound_stays_below_the_truth_beyond_max_epsilon():
    """A profile whose last secant reaches 0 only beyond e^500 (mu-GDP, mu = 33): the
    optimistic pair must not keep the last delta as an atom at +inf."""
    from fdp.tradeoff.gaussian import gaussian_delta

    mech = fdp.FromDelta(lambda e: gaussian_delta(e, 33.0))
    acc = fdp.PLDAccountant().compose(mech, 1)
    for eps in (505.0, 600.0):
        lo, hi = acc.get_delta_bounds(eps)
        truth = float(gaussian_delta(eps, 33.0))
        assert lo <= truth * (1 + 1e-9) + 1e-12 <= hi * (1 + 1e-9) + 2e-12, (eps, lo, truth, hi)


def _exact_epsilon_of_pair(p0: np.ndarray, p1: np.ndarray, steps: int, delta: float) -> float:
    """epsilon(delta) of T compositions of a small discrete pair, both directions, by
    enumerating every outcome sequence (exact up to the root finder's 1e-14)."""
    import itertools
    from collections import Counter

    from scipy.optimize import brentq

    best = 0.0
    for P, Q in ((p0, p1), (p1, p0)):
        atoms, at_inf = Counter(), 0.0
        for combo in itertools.product(range(len(P)), repeat=steps):
            mass = math.prod(P[i] for i in combo)
            if mass == 0.0:
                continue
            if any(Q[i] == 0.0 for i in combo):
                at_inf += mass
                continue
            atoms[sum(math.log(P[i] / Q[i]) for i in combo)] += mass

        def delta_of(e: float) -> float:
            return at_inf + sum(m * max(0.0, -math.expm1(e - ell)) for ell, m in atoms.items())

        if delta_of(0.0) > delta:
            best = max(best, brentq(lambda e: delta_of(e) - delta, 0.0, 60.0, xtol=1e-14))
    return best


@pytest.mark.parametrize("jump_at", [0.7, 0.3])
@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("delta", [1e-3, 0.3])
def test_from_delta_of_a_profile_with_a_jump_brackets_the_least_private_mechanism(jump_at, steps, delta):
    """delta(eps) = 0.5 for eps < c, 0 after: not convex in e^eps, so no mechanism has it
    as its exact profile. FromDelta accounts for the least private mechanism it allows,
    f = sup_eps max(0, 1 - delta(eps) - e^eps alpha, e^-eps (1 - delta(eps) - alpha)),
    here the envelope of (0, 0.5) and (c, 0); its epsilon, by exact enumeration of that
    pair's compositions, is inside the bracket. (At c = 0.7, off the grid, the lower
    bound was 0.69870 where the truth is 0.69850: the secant bound assumed convexity.)"""
    profile = lambda e: np.where(np.asarray(e) < jump_at, 0.5, 0.0)  # noqa: E731
    with pytest.warns(NonConvexProfileWarning, match="not convex"):
        mech = fdp.FromDelta(profile)
    lo, hi = fdp.PLDAccountant().compose(mech, steps).get_epsilon_bounds(delta)
    envelope = fdp.epsilon_delta_curve(np.array([0.0, jump_at]), np.array([0.5, 0.0]))
    lp0, lp1 = symmetric_pair_from_curve(envelope)
    exact = _exact_epsilon_of_pair(np.exp(lp0), np.exp(lp1), steps, delta)
    assert lo <= exact * (1 + 1e-12) + 1e-15 and exact <= hi * (1 + 1e-12) + 1e-15


def test_from_delta_of_valid_profiles_does_not_warn_and_nonconvexity_is_located():
    grid = np.linspace(0.0, 8.0, 4097)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonConvexProfileWarning)
        fdp.FromDelta(gdp(1.0))
        fdp.FromDelta(rr_profile(0.7))  # linear in e^eps up to rounding
        fdp.FromDelta(lambda e: max(0.0, 1.0 - math.exp((e - 1.0) / 2)))  # Laplace
    assert first_nonconvex_point(grid, gaussian_delta(grid, 1.3)) is None
    jump = np.where(grid < 2.0, 0.25, 0.0)
    j = first_nonconvex_point(grid, jump)
    assert j is not None and abs(grid[j] - 2.0) < 0.01


@pytest.mark.parametrize("eps0", [0.689, 2.7136, 2.6615915318105268, 1.3, 4.2])
def test_from_delta_of_rr_has_no_rounding_atom_at_infinite_loss(eps0):
    """Near the fixed point the polygon of RR has a vertex an ulp off the diagonal, which
    left an outcome (5e-17, 0) in the optimistic pair: a lower bound on epsilon of inf at
    delta = 1e-18 where the truth is eps0 (and above the upper bound at eps0 = 2.7136),
    and a delta lower bound of 5.6e-17 where the truth is 0."""
    grid = np.union1d(np.linspace(0.1, 2 * eps0, 21), [eps0])
    acc = fdp.PLDAccountant().compose(fdp.FromDelta(rr_profile(eps0), epsilons=grid), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an upper bound of inf warns
        lo, hi = acc.get_epsilon_bounds(1e-18)
    assert lo <= eps0 + 1e-12 and lo <= hi
    assert acc.get_delta_bounds(eps0 + 0.5)[0] == 0.0


# ------------------------------------------------ extreme but valid parameters (red team)
def _quiet_bounds(acc, query, arg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return getattr(acc, query)(arg)


@pytest.mark.parametrize("p", [1.0, 0.01])
def test_laplace_with_a_tiny_scale_gives_its_huge_epsilon(p):
    """Laplace(scale=1e-50) raised OverflowError (the atoms' mass error e^{16u * 1e50}).
    Its loss is ~ +mu = 1e50 at each step that samples the individual: 10 steps at delta
    1e-5 need all 10 (p = 1: 2^-10 of the mass keeps mu - O(1) each) or 3 (p = 0.01)."""
    acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=1e-50, sampling_rate=p), 10)
    lo, hi = _quiet_bounds(acc, "get_epsilon_bounds", 1e-5)
    steps = 10 if p == 1.0 else 3
    assert lo <= steps * 1e50 <= hi * (1 + 1e-12) and hi <= steps * 1e50 * (1 + 1e-9), (lo, hi)
    truth = 1.0 if p == 1.0 else 1.0 - 0.99**10  # delta(1): 1 - P(no step samples the individual)
    d_lo, d_hi = _quiet_bounds(acc, "get_delta_bounds", 1.0)
    assert d_lo <= truth + 1e-12 and d_hi >= truth - 1e-12


def test_laplace_bins_its_losses_above_709():
    """Scale 1e-3 (mu = 1000): e^loss overflowed in the cell edges x(loss), so every loss of
    the continuous part above 709 was binned at 709: delta(9000) of 10 steps came out
    0.17 for both bounds, while each step's loss is mu - 2 Exp(1) or mu (truth ~ 1)."""
    acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=1e-3), 10)
    lo, hi = _quiet_bounds(acc, "get_delta_bounds", 9000.0)
    assert lo > 1.0 - 1e-9 and hi == 1.0
    lo, hi = _quiet_bounds(acc, "get_delta_bounds", 9995.0)  # P(sum of 2 Exp(1) over C-steps < 5)
    assert 0.1 < lo <= hi < 0.15


def test_gaussian_with_a_tiny_noise_multiplier_under_sampling_gives_its_epsilon():
    """Gaussian(1e-100, sampling_rate=0.01) raised "grid needs finite lo <= hi and h > 0"
    (the loss's variance 1e200^2 overflowed). A step that samples the individual has loss
    ~ mu^2 / 2 = 5e199; at delta 1e-5, 3 of 10 steps must (P(>= 4) = 2e-6 < 1e-5)."""
    acc = fdp.PLDAccountant().compose(fdp.Gaussian(1e-100, sampling_rate=0.01), 10)
    lo, hi = _quiet_bounds(acc, "get_epsilon_bounds", 1e-5)
    assert lo <= 1.5e200 * (1 + 1e-3) and hi >= 1.5e200 * (1 - 1e-3) and hi <= 1.6e200


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: fdp.Gaussian(1e-200), "noise_multiplier must be in [1e-150, inf); got 1e-200"),
        (lambda: fdp.Gaussian(1e-200, sampling_rate=0.01), "noise_multiplier must be in [1e-150, inf)"),
        (lambda: fdp.Laplace(scale=5e-324), "scale must be in [1e-300, inf); got 5e-324"),
        (lambda: fdp.RandomizedResponse(epsilon=1e308), "epsilon must be in [0, 1e+300]; got 1e+308"),
    ],
)
def test_a_loss_beyond_float64_range_is_refused_naming_the_parameter(make, expected):
    """Gaussian(1e-200) was accepted and its queries failed on a NaN grid; Laplace(5e-324)
    (1 / scale = inf) likewise; randomized response at 1e308 overflowed in composition."""
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value).startswith(expected), info.value


def test_a_composition_beyond_float64_range_names_the_steps_that_fit():
    """10^9 steps of loss 1e300 each: float('inf') became a grid index (OverflowError)."""
    acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=1e-300), 10**9)
    with pytest.raises(ValueError, match=r"^steps must be at most 999999 for Laplace\(scale=1e-300"):
        acc.get_epsilon_bounds(1e-5)
    acc = fdp.PLDAccountant().compose(fdp.Laplace(scale=1e-300), 1000)
    assert _quiet_bounds(acc, "get_epsilon_bounds", 1e-5)[1] == pytest.approx(1e303, rel=1e-3)


def test_from_delta_of_a_tradeoff_curve_says_to_pass_its_profile():
    """A curve is callable (alpha -> beta): FromDelta(curve) failed inside the profile's
    evaluation with "alpha must be finite numbers in [0, 1]; got 2.0"."""
    with pytest.raises(TypeError, match=r"delta_of_epsilon must be callable \(eps -> delta\); got GaussianCurve: "
                                        r"pass its privacy profile, curve.delta"):
        fdp.FromDelta(fdp.gaussian_curve(1.0))
