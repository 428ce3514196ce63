"""The shuffling lower bound: its model against a simulation of shuffling, its value against
the exact privacy of that model, and against random allocation at half the noise."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, special

import fdp
from fdp.shuffling import max_statistic_pair


def _simulated_max(n: int, b: int, sigma: float, with_extra: bool, runs: int, seed: int) -> np.ndarray:
    """The largest noisy batch sum of one shuffled epoch, simulated as a trainer runs it:
    n examples with gradient -1 (plus one with +1), a permutation, floor(size / b) batches
    of b, the rest dropped, N(0, sigma^2) noise on each sum; shifted by +b and scaled by
    1 / sigma as in the module's pair (1)."""
    rng = np.random.default_rng(seed)
    values = np.concatenate([-np.ones(n), [1.0] if with_extra else []])
    t = values.size // b
    out = np.empty(runs)
    for i in range(runs):
        batches = rng.permutation(values)[: t * b].reshape(t, b).sum(axis=1)
        out[i] = ((batches + b) / sigma + rng.normal(size=t)).max()
    return out


@pytest.mark.parametrize(("n", "b"), [(7, 3), (8, 3)])  # x* added (r = 1); removed from D (r = 2 = B - 1)
def test_the_pair_is_what_a_shuffled_epoch_releases(n: int, b: int) -> None:
    """Kolmogorov-Smirnov distance between the binned laws (2) and simulated shuffling."""
    sigma, runs = 0.8, 20000
    p, q = max_statistic_pair(sigma, b, n, bins=400)
    t, r = divmod(n, b)
    # (2) bins the max over the module's edges; rebuild them to compare CDFs at the edges
    lo = min(-4.0, float(math.sqrt(2) * special.erfinv(2 * 1e-30 ** (1.0 / t) - 1)))
    edges = np.linspace(lo, 2 / sigma + 12.0, 401)
    if r <= b - 2:  # D (n rows) against D plus x*
        with_x, without_x = _simulated_max(n, b, sigma, True, runs, 1), _simulated_max(n, b, sigma, False, runs, 2)
    else:  # D minus x* is D without one of the -1 rows and without x*: n - 1 rows of -1
        with_x, without_x = (_simulated_max(n - 1, b, sigma, True, runs, 1),
                             _simulated_max(n - 1, b, sigma, False, runs, 2))
    for law, sample in ((p, with_x), (q, without_x)):
        model = np.cumsum(law)[:-1]  # CDF at the edges
        empirical = np.searchsorted(np.sort(sample), edges, side="right") / runs
        assert np.max(np.abs(model - empirical)) < 1.8 / math.sqrt(runs)  # KS at p ~ 0.003


def _exact_delta_two_batches(eps: float, sigma: float, q: float) -> float:
    """delta(eps) of pair (1) with t = 2, one epoch: P = (1-q)/2 [N((a,0)) + N((0,a))] + q N(0),
    Q = N(0) with a = 2 / sigma, by quadrature over y1 of a closed form in y2."""
    a = 2.0 / sigma

    def inner(y1: float) -> float:
        w1 = math.exp(a * y1 - a * a / 2)
        level = 2 * (math.exp(eps) - q) / (1 - q) - w1  # LR > e^eps <=> w2 > level
        cut = -math.inf if level <= 0 else (math.log(level) + a * a / 2) / a
        tail, tail_shift = special.ndtr(-cut), special.ndtr(a - cut)
        value = ((1 - q) / 2 * w1 + q - math.exp(eps)) * tail + (1 - q) / 2 * tail_shift
        return math.exp(-y1 * y1 / 2) / math.sqrt(2 * math.pi) * value

    return integrate.quad(inner, -12, 12 + a, epsabs=1e-14, epsrel=1e-12, limit=400)[0]


@pytest.mark.parametrize(("sigma", "n", "b"), [(0.5, 4, 2), (1.0, 4, 2), (2.0, 5, 2)])
def test_the_bound_is_below_the_exact_privacy_of_the_pair(sigma: float, n: int, b: int) -> None:
    """t = 2, one epoch: delta of the real pair at the bound's epsilon is still >= delta."""
    t, r = divmod(n, b)
    q = (r + 1) / (n + 1) if r <= b - 2 else r / n
    for delta in (1e-2, 1e-4):
        eps = fdp.shuffled_lower_bound(sigma, b, n, 1, delta)
        assert eps > 0
        assert _exact_delta_two_batches(eps, sigma, q) >= delta
        # and it is not vacuous: the exact epsilon is within 10 % (the max is a strong test here)
        assert _exact_delta_two_batches(1.1 * eps, sigma, q) < delta


def test_below_random_allocation_at_half_the_noise() -> None:
    """Pair (1) is random allocation's pair at sigma / 2 mixed with Q, so no easier to tell
    apart: the bound stays below RandomAllocation(sigma / 2)'s upper bound."""
    for epochs in (1, 5):
        lower = fdp.shuffled_lower_bound(2.0, 100, 1050, epochs, 1e-5)
        epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.0), steps_per_epoch=10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            upper = fdp.PLDAccountant().compose(epoch, steps=epochs).get_epsilon(1e-5)
        assert 0 < lower <= upper


def test_it_exceeds_poisson_accounting_at_the_standard_setting() -> None:
    """sigma 1, B 256, N 60000, 10 epochs: Poisson accounting claims ~1.10; a shuffled run has > 8."""
    lower = fdp.shuffled_lower_bound(1.0, 256, 60000, 10, 1e-5)
    poisson = fdp.dpsgd(noise_multiplier=1.0, batch_size=256, dataset_size=60000, epochs=10).get_epsilon(1e-5)
    assert lower > 7 * poisson
    assert fdp.shuffled_lower_bound(1.0, 256, 60000, 20, 1e-5) > lower


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(batch_size=1), "batch_size"),
    (dict(batch_size=101), "batch_size"),
    (dict(dataset_size=1, batch_size=2), "dataset_size"),
    (dict(epochs=0), "epochs"),
    (dict(delta=1.0), "delta"),
])
def test_bad_input_names_the_argument(kwargs: dict, name: str) -> None:
    args = dict(noise_multiplier=1.0, batch_size=10, dataset_size=100, epochs=1, delta=1e-5) | kwargs
    with pytest.raises(ValueError, match=name):
        fdp.shuffled_lower_bound(**args)


def test_sampling_page_shuffling_block_prints_what_it_says() -> None:
    from doc_blocks import run_first_block, said_to_print, section

    text = section("sampling.md", "## Shuffling")
    assert run_first_block(text, "sampling.md").strip() == said_to_print(text)


def test_cli_prints_a_lower_bound_only(capsys) -> None:
    import json

    from fdp.cli import main

    base = ["--noise-multiplier", "1", "--batch-size", "100", "--dataset-size", "1050", "--delta", "1e-5",
            "--sampling", "shuffle"]
    assert main(["epsilon", *base, "--epochs", "3.7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["upper"] is None and out["epochs"] == 3  # whole epochs only: a lower bound
    assert out["lower"] == fdp.shuffled_lower_bound(1.0, 100, 1050, 3, 1e-5)
    assert main(["delta", *base[:6], "--epochs", "3", "--epsilon", "1", "--sampling", "shuffle"]) == 2
    assert "lower bound" in capsys.readouterr().err
    assert main(["epsilon", *base, "--epochs", "0.5"]) == 2
    assert "epochs" in capsys.readouterr().err
