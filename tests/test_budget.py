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


def test_most_steps_meets_the_budget_and_one_more_unit_does_not() -> None:
    step = fdp.Gaussian(noise_multiplier=1.1, sampling_rate=256 / 60000)
    epochs = fdp.most_steps(step, target_epsilon=1.5, delta=1e-5, unit=235)
    assert _epsilon(step, epochs * 235) <= 1.5 < _epsilon(step, (epochs + 1) * 235)
    with pytest.raises(ValueError, match="unreachable: even 235 step"):
        fdp.most_steps(step, target_epsilon=1e-3, delta=1e-5, unit=235)
    with pytest.raises(ValueError, match="mechanism must be an fdp mechanism"):
        fdp.most_steps("gaussian", target_epsilon=1.0, delta=1e-5)
