"""Random allocation of the Gaussian step at small noise multipliers (sigma 0.45-0.75).

Below where the linear lattice fits at its intended spacing, a Gaussian epoch is the
one-component mixture with the large term on logarithmic classes; and every lattice's
convolutions are exponentially tilted, so the FFT's uniform round-off bound no longer
reaches the P-masses multiplied by large likelihood ratios. Checked here: the tilted
convolutions bracket an exact one; the tilt shrinks what is charged at +inf; the small-sigma
route brackets mpmath (t = 2) and Monte Carlo (t = 10); the two routes, independent
discretisations of the same epoch, overlap where both apply.
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.fft

import fdp
import fdp.mechanisms.allocation_fft as fft_module
import fdp.mechanisms.allocation_lattice as lattice_module
import fdp.mechanisms.random_allocation as ra
from fdp.mechanisms.allocation_fft import Chernoff, tilt_exponent
from fdp.mechanisms.allocation_lattice import U, term_sums
from fdp.mechanisms.allocation_terms import gaussian_term_law
from fdp.pld.cells import Direction
from test_random_allocation import _two_step_delta, check_monte_carlo_delta


def _exact_sums(a: np.ndarray, b: np.ndarray, terms: int) -> tuple[np.ndarray, np.ndarray]:
    """Q(M = m) and E_Q[R - m spacing ; M = m] / terms, by direct convolution in
    extended precision (its error is far below the FFT bounds checked against it)."""
    a_ld, b_ld = a.astype(np.longdouble), b.astype(np.longdouble)
    power = np.ones(1, dtype=np.longdouble)
    for _ in range(terms - 1):
        power = np.convolve(power, a_ld)
    return np.convolve(power, a_ld), np.convolve(power, b_ld)


def test_tilted_term_sums_bracket_the_exact_convolution() -> None:
    law = gaussian_term_law(1 / 0.8, 0.05, 400)
    terms = 6
    chernoff = Chernoff.of(law, terms)
    lo, hi = chernoff.window(fft_module.WRAP_TAIL)
    n = scipy.fft.next_fast_len(int((hi - lo) * (1 + fft_module.TILT_PAD)) + 1, real=True)
    assert tilt_exponent(law, terms, lo, n, chernoff) > 0  # the tilted path is what is checked
    sums = term_sums(law, terms)
    q_exact, rho_exact = _exact_sums(law.a, law.b_lo, terms)
    m = sums.m.astype(int)
    q, rho = q_exact[m].astype(np.float64), terms * rho_exact[m].astype(np.float64)
    slack = 8 * U * np.abs(q)  # the extended-precision reference's own rounding
    assert np.all(sums.q_lo <= q + slack) and np.all(q - slack <= sums.q_hi)
    assert np.all(sums.rho_lo <= rho * (1 + 8 * U) + 1e-300)
    assert np.max(sums.q_hi - sums.q_lo) < 1e-12  # a bracket, not a vacuous one


def _charged_with_and_without_tilt(monkeypatch: pytest.MonkeyPatch, build) -> tuple[float, float]:
    tilted = build()
    monkeypatch.setattr(fft_module, "tilt_exponent", lambda *args: 0.0)
    flat = build()
    return (lattice_module.pessimistic_atoms(tilted, Direction.REMOVE)[2],
            lattice_module.pessimistic_atoms(flat, Direction.REMOVE)[2])


def test_the_tilt_shrinks_the_p_mass_charged_at_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """sigma 0.7, t = 98 (linear route): the FFT's round-off bound, the same on every class
    of the sum, is charged to the P-masses multiplied by the classes' likelihood ratios;
    tilted, large ratios get less of it (here 4.9e-8 -> 3.6e-8 per epoch; the window of
    ~10^5 classes limits the tilt)."""
    p_tilted, p_flat = _charged_with_and_without_tilt(monkeypatch, lambda: ra._lattice.__wrapped__(1 / 0.7, 98))
    assert p_tilted < 0.9 * p_flat, (p_tilted, p_flat)


@pytest.mark.slow
def test_the_tilt_shrinks_the_charge_of_a_long_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """sigma 0.5, t = 98 (mixture route, a window of 4 million classes): 1.4e-6 of P-mass
    per epoch charged at +inf without the tilt, 1.0e-7 with it (benchmarks/allocation_charge.py)."""
    step = fdp.Gaussian(noise_multiplier=0.5)
    p_tilted, p_flat = _charged_with_and_without_tilt(
        monkeypatch, lambda: ra._mixture_lattice.__wrapped__(step, 98, True))
    assert p_tilted < p_flat / 5, (p_tilted, p_flat)


@pytest.mark.parametrize("sigma", [0.46, pytest.param(0.5, marks=pytest.mark.slow)])
def test_small_sigma_two_steps_bracket_the_mpmath_delta(sigma: float) -> None:
    """t = 2 below the linear lattice's reach: the mixture route against the closed-form
    quadrature, one lattice for both epsilons and the epsilon query. Red team (earlier):
    sigma 0.46 at t = 2 passed construction, then the first query raised; now the route is
    decided at construction and its first query answers. (At t = 2 the FFT's round-off,
    weighted by likelihood ratios up to 10^5, charges ~5e-5 of P-mass per epoch at +inf:
    a delta below that has no finite epsilon; the charge falls with t, ~1e-7 at t = 98.)"""
    assert not ra._linear(1 / sigma, 2)
    epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=sigma), steps_per_epoch=2)
    accountant = fdp.PLDAccountant().compose(epoch)
    for eps in (0.5, 2.0):
        lower, upper = accountant.get_delta_bounds(eps)
        truth = _two_step_delta(sigma, eps)
        assert lower <= truth <= upper, eps
        assert upper - lower <= 2e-2 * truth, eps
    lower, upper = fdp.PLDAccountant().compose(epoch, steps=2).get_epsilon_bounds(1e-2)
    assert 0 < lower <= upper < 1.05 * lower


def test_small_sigma_monte_carlo_delta_lies_in_the_bracket() -> None:
    """t = 10, sigma = 0.5 (the mixture route): each direction's bracket meets the Monte
    Carlo interval of delta(1) from 2e6 fixed-seed samples."""
    assert not ra._linear(1 / 0.5, 10)
    check_monte_carlo_delta(0.5, 10, 1.0, seed=20261128)


def _delta_bracket(losses_up, masses_up, p_inf, losses_lo, masses_lo, eps: float) -> tuple[float, float]:
    def delta(losses, masses):
        return float(np.sum(masses * -np.expm1(np.minimum(eps - losses, 0.0))))
    return delta(losses_lo, masses_lo), delta(losses_up, masses_up) + p_inf


@pytest.mark.parametrize("direction", [Direction.REMOVE, Direction.ADD])
def test_the_two_routes_overlap_where_both_apply(direction: Direction) -> None:
    """sigma 0.75, t = 20: the linear lattice and the one-component mixture with its large
    term on log classes are two discretisations of one epoch; both certified, so their
    delta brackets of one epoch must overlap."""
    mu, t, eps = 1 / 0.75, 20, 1.0
    step = fdp.Gaussian(noise_multiplier=0.75)
    assert ra._linear(mu, t)
    linear = _delta_bracket(*ra._atoms(mu, t, direction, True), *ra._atoms(mu, t, direction, False)[:2], eps)
    mixture = _delta_bracket(*ra._mixture_atoms(step, t, direction, True),
                             *ra._mixture_atoms(step, t, direction, False)[:2], eps)
    assert linear[0] <= mixture[1] and mixture[0] <= linear[1], (linear, mixture)
    for lo, hi in (linear, mixture):  # one epoch: the two-atom split costs O(spacing)
        assert hi - lo <= 0.1 * hi, (linear, mixture)


def test_the_charge_benchmark_quick_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "allocation_charge.py"
    spec = importlib.util.spec_from_file_location("allocation_charge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split("|")
    assert row[1].strip() == "0.6" and row[3].strip() == "linear" and 0 < float(row[4]) < 1e-5
    assert module.main(["--pairs"]) == 0
    plan_rows = [line for line in capsys.readouterr().out.splitlines() if "(the plan)" in line]
    assert len(plan_rows) == 2 and all(line.split("|")[7].strip() == "yes" for line in plan_rows)
