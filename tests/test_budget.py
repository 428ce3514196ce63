"""fdp.fewest_jl_projections and fdp.most_steps: the extreme value that meets the budget,
and the one past it that does not."""

from __future__ import annotations

import warnings

import pytest

import fdp


def _epsilon(mechanism, steps: int, delta: float = 1e-5) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fdp.PLDAccountant().compose(mechanism, steps=steps).get_epsilon(delta)


def test_fewest_jl_projections_meets_the_budget_and_one_fewer_does_not() -> None:
    seen: list[tuple[int, bool]] = []
    kwargs = dict(noise_multiplier=1.5, sampling_rate=0.01, steps=200, target_epsilon=1.0, delta=1e-5)
    r = fdp.fewest_jl_projections(**kwargs, progress=lambda r, ok: seen.append((r, ok)))
    assert _epsilon(fdp.JL(noise_multiplier=1.5, jl_projections=r, sampling_rate=0.01), 200) <= 1.0
    assert _epsilon(fdp.JL(noise_multiplier=1.5, jl_projections=r - 1, sampling_rate=0.01), 200) > 1.0
    assert seen and seen[0][0] == 8
    with pytest.raises(ValueError, match="unreachable: even the Gaussian"):
        fdp.fewest_jl_projections(**{**kwargs, "target_epsilon": 0.01})
    with pytest.raises(ValueError, match="fdp.fewest_jl_projections"):
        fdp.calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, steps=10, mechanism="jl", sampling_rate=0.1)


def test_fewest_jl_projections_of_a_callable_family_and_refusals_as_misses() -> None:
    """The callable form (another sampling of the JL step) searches the same r as the
    built-in one when it builds the same mechanism; an r the accountant refuses counts as
    a miss, so what is returned is certified; the r -> infinity limit fails fast."""
    kwargs = dict(steps=200, target_epsilon=1.0, delta=1e-5)
    family = lambda r: fdp.JL(noise_multiplier=1.5, jl_projections=r, sampling_rate=0.01)  # noqa: E731
    built_in = fdp.fewest_jl_projections(noise_multiplier=1.5, sampling_rate=0.01, **kwargs)
    assert fdp.fewest_jl_projections(mechanism=family, **kwargs) == built_in

    def refusing(r: int):
        if r < built_in + 3:
            raise ValueError("cannot certify this one")
        return family(r)

    seen: list[tuple[int, bool]] = []
    assert fdp.fewest_jl_projections(mechanism=refusing, progress=lambda r, ok: seen.append((r, ok)),
                                     **kwargs) == built_in + 3
    assert (built_in + 2, False) in seen
    limit = fdp.Gaussian(noise_multiplier=1.5, sampling_rate=0.01)
    with pytest.raises(ValueError, match="unreachable: even the Gaussian"):
        fdp.fewest_jl_projections(mechanism=family, limit=limit, **{**kwargs, "target_epsilon": 0.01})
    with pytest.raises(ValueError, match="not both"):
        fdp.fewest_jl_projections(mechanism=family, noise_multiplier=1.5, **kwargs)
    with pytest.raises(ValueError, match="needs noise_multiplier and sampling_rate"):
        fdp.fewest_jl_projections(noise_multiplier=1.5, **kwargs)
    with pytest.raises(ValueError, match="limit must be an fdp mechanism"):
        fdp.fewest_jl_projections(mechanism=family, limit="gaussian", **kwargs)


def test_most_steps_meets_the_budget_and_one_more_unit_does_not() -> None:
    step = fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000)
    epochs = fdp.most_steps(step, target_epsilon=1.5, delta=1e-5, unit=235)
    assert _epsilon(step, epochs * 235) <= 1.5 < _epsilon(step, (epochs + 1) * 235)
    with pytest.raises(ValueError, match="unreachable: even 235 step"):
        fdp.most_steps(step, target_epsilon=1e-3, delta=1e-5, unit=235)
    with pytest.raises(ValueError, match="mechanism must be an fdp mechanism"):
        fdp.most_steps("gaussian", target_epsilon=1.0, delta=1e-5)


def test_the_training_pages_budget_numbers() -> None:
    """docs/training.md: for IMDb's run (N = 25,000, B = 256, 15 epochs, eps <= 8 at
    delta = 1e-5) r = 30 needs sigma = 0.707, and sigma = 0.8 needs r = 20."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    assert "at r = 30 the budget needs σ = 0.707" in page and "(20 here" in page
    steps = fdp.epochs_to_steps(15, batch_size=256, dataset_size=25_000)
    common = dict(steps=steps, target_epsilon=8.0, delta=1e-5, sampling_rate=256 / 25_000)
    assert fdp.fewest_jl_projections(noise_multiplier=0.8, **common) == 20
    sigma = fdp.calibrate_noise_multiplier(mechanism="jl", jl_projections=30, **common)
    assert round(sigma, 3) == 0.707
