"""Budget-first training: make_private(target_epsilon=...) and PrivacyCallback(stop_at_epsilon=...).

The invariants: the noise multiplier chosen is the smallest the certified bound allows
(one a little smaller misses the budget); what fit then books for the planned epochs is
exactly the run that was planned (its epsilon equals the one certified at calibration),
under every sampling scheme; no step runs without a noise multiplier; a budget given to
the callback is never exceeded by an epoch it lets start.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", minversion="2.16")
keras = pytest.importorskip("keras", minversion="3.0")

import fdp_tf  # noqa: E402
from fdp_tf.budget import planned_segment  # noqa: E402
from fdp_tf.ledger import PrivacyLedger  # noqa: E402

N, DELTA = 600, 1e-5


def _data():
    rng = np.random.default_rng(0)
    return rng.random((N, 4), dtype=np.float32), rng.integers(0, 2, N).astype("int32")


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(2)])


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _batches(scheme: str, x, y):
    if scheme == "poisson":
        return fdp_tf.poisson_batches(x, y, expected_batch_size=60)
    if scheme == "random_allocation":
        return fdp_tf.random_allocation_batches(x, y, steps_per_epoch=10)
    return fdp_tf.without_replacement_batches(x, y, batch_size=60)


@pytest.mark.parametrize("scheme", ["poisson", "random_allocation", "without_replacement"])
def test_the_planned_run_is_the_booked_run_and_the_noise_is_the_smallest(scheme: str) -> None:
    x, y = _data()
    data = _batches(scheme, x, y)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, learning_rate=0.1)
    model = fdp_tf.make_private(_model(), optimizer=optimizer, loss=_loss(), target_epsilon=2.0, delta=DELTA,
                                epochs=3, data=data, verbose=False)
    budget = model.budget
    assert optimizer.noise_multiplier == budget.noise_multiplier
    assert budget.epsilon <= 2.0
    # minimal: 0.5 % less noise misses the budget (the search's tolerance is 0.1 %)
    smaller = planned_segment(optimizer, data, 3, noise_multiplier=budget.noise_multiplier * 0.995)
    assert PrivacyLedger((smaller,)).epsilon(DELTA) > 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the planned epochs: no budget warning
        model.fit(data, epochs=3, verbose=0)
    assert model.epsilon(DELTA) == pytest.approx(budget.epsilon, rel=1e-12)
    assert model.ledger.steps == budget.steps


def test_jl_noise_for_a_budget() -> None:
    x, y = _data()
    data = _batches("poisson", x, y)
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, jl_projections=4, learning_rate=0.1)
    model = fdp_tf.make_private(_model(), optimizer=optimizer, loss=_loss(), target_epsilon=4.0, delta=DELTA,
                                epochs=2, data=data, verbose=False)
    gaussian = fdp_tf.noise_multiplier_for(fdp_tf.DPSGDVanilla(l2_norm_clip=1.0), data, target_epsilon=4.0,
                                           delta=DELTA, epochs=2)
    # the JL step's sensitivity is random (heavier tail): it needs more noise for the same budget
    assert model.budget.noise_multiplier > gaussian.noise_multiplier
    model.fit(data, epochs=2, verbose=0)
    assert model.epsilon(DELTA) == pytest.approx(model.budget.epsilon, rel=1e-12) and model.budget.epsilon <= 4.0


def test_make_private_prints_what_it_chose(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _data()
    fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0), loss=_loss(), target_epsilon=3.0,
                        delta=DELTA, epochs=2, data=_batches("poisson", x, y))
    out = capsys.readouterr().out
    assert "noise_multiplier=" in out and "budget 3" in out and "Poisson sampling" in out


def test_fitting_past_the_plan_warns_and_the_callback_stops_within_the_budget() -> None:
    x, y = _data()
    data = _batches("poisson", x, y)
    model = fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0), loss=_loss(),
                                target_epsilon=2.0, delta=DELTA, epochs=3, data=data, verbose=False)
    callback = fdp_tf.PrivacyCallback(delta=DELTA, stop_at_epsilon=2.0)
    with pytest.warns(UserWarning) as caught:
        history = model.fit(data, epochs=6, verbose=0, callbacks=[callback])
    said = " ".join(str(w.message) for w in caught)
    assert "above the budget 2" in said and "stopped training after epoch 3" in said
    assert len(history.history["epsilon"]) == 3 and callback.stopped_epoch == 2
    assert model.epsilon(DELTA) <= 2.0


def test_the_callback_refuses_a_first_epoch_beyond_its_budget() -> None:
    x, y = _data()
    model = fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=0.7),
                                loss=_loss())
    with pytest.raises(ValueError, match="nothing was trained"):
        model.fit(_batches("poisson", x, y), epochs=2, verbose=0,
                  callbacks=[fdp_tf.PrivacyCallback(delta=DELTA, stop_at_epsilon=0.5)])
    assert model.ledger.steps == 0


def test_no_step_runs_without_a_noise_multiplier() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match="noise_multiplier of DPSGDVanilla is None.*target_epsilon"):
        fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0), loss=_loss())
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, jl_projections=2, expected_batch_size=8)
    model = _model()
    with pytest.raises(ValueError, match="noise_multiplier of DPSGDJL is None"):
        optimizer.compute_private_gradients(lambda: None, model.trainable_variables)
    with pytest.raises(ValueError, match="noise_multiplier of DPSGDJL is None"):
        fdp_tf.PrivateModel(model).compile(optimizer=optimizer, loss=_loss())


# random allocation of the JL step: ~40 s of lattices, so slow (its search is the callable
# form of fdp.fewest_jl_projections, tested in tests/test_budget.py)
@pytest.mark.parametrize("scheme", ["poisson", pytest.param("random_allocation", marks=pytest.mark.slow)])
def test_the_fewest_projections_for_a_budget(scheme: str) -> None:
    """sigma given, r left out: the r chosen is the fewest the certified bound allows (one
    fewer misses), the same as fdp.fewest_jl_projections on the same sampling, and fit
    books exactly the planned run."""
    import fdp

    x, y = _data()
    data = _batches(scheme, x, y)
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=3.0, learning_rate=0.1)
    model = fdp_tf.make_private(_model(), optimizer=optimizer, loss=_loss(), target_epsilon=3.0, delta=DELTA,
                                epochs=2, data=data, verbose=False)
    budget = model.budget
    r = optimizer.jl_projections
    assert budget.chose == "jl_projections" and budget.jl_projections == r and budget.noise_multiplier == 3.0
    fewer = planned_segment(optimizer, data, 2)  # r as chosen
    assert PrivacyLedger((fewer,)).epsilon(DELTA) == pytest.approx(budget.epsilon, rel=1e-12)
    assert budget.epsilon <= 3.0
    fewer = fewer.__class__(**{**fewer.__dict__, "jl_projections": r - 1})
    assert PrivacyLedger((fewer,)).epsilon(DELTA) > 3.0
    if scheme == "poisson":
        assert r == fdp.fewest_jl_projections(noise_multiplier=3.0, sampling_rate=60 / N, steps=budget.steps,
                                              target_epsilon=3.0, delta=DELTA)
    model.fit(data, epochs=2, verbose=0)
    assert model.epsilon(DELTA) == pytest.approx(budget.epsilon, rel=1e-12)
    assert "jl_projections=" in budget.describe() and "(the fewest)" in budget.describe()


def test_no_step_runs_without_projections_and_a_budget_fixes_only_one_of_sigma_and_r() -> None:
    x, y = _data()
    data = _batches("poisson", x, y)
    with pytest.raises(ValueError, match="jl_projections of DPSGDJL is None.*the fewest projections"):
        fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0),
                            loss=_loss())
    optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, expected_batch_size=8)
    with pytest.raises(ValueError, match="noise_multiplier and jl_projections of DPAdamJL are None"):
        optimizer.compute_private_gradients(lambda: None, _model().trainable_variables)
    with pytest.raises(ValueError, match="neither noise_multiplier nor jl_projections"):
        fdp_tf.make_private(_model(), optimizer=optimizer, loss=_loss(), target_epsilon=2.0, delta=DELTA,
                            epochs=2, data=data)
    with pytest.raises(ValueError, match="unreachable: even the Gaussian"):
        fdp_tf.jl_projections_for(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=0.5), data,
                                  target_epsilon=0.1, delta=DELTA, epochs=2)
    with pytest.raises(ValueError, match="accounted for DP-SGD \\(exact clipping\\) only"):
        fdp_tf.jl_projections_for(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=3.0),
                                  _batches("without_replacement", x, y), target_epsilon=3.0, delta=DELTA, epochs=2)
    with pytest.raises(ValueError, match="needs a JL optimizer"):
        fdp_tf.jl_projections_for(fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0), data,
                                  target_epsilon=3.0, delta=DELTA, epochs=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer="sgd"), "needs a DP optimizer"),
    (dict(noise_multiplier=1.0), "either target_epsilon or the optimizer's noise_multiplier"),
    (dict(delta=None), "needs delta too"),
    (dict(data="plain"), "data must be a dataset made by fdp_tf.poisson_batches"),
    (dict(epochs=0), "epochs"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
])
def test_a_budget_with_a_wrong_part_is_refused(kwargs, message) -> None:
    x, y = _data()
    args = dict(target_epsilon=2.0, delta=DELTA, epochs=2, data=_batches("poisson", x, y))
    sigma = kwargs.pop("noise_multiplier", None)
    optimizer = kwargs.pop("optimizer", None) or fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=sigma)
    if args.get("data") is not None and kwargs.get("data") == "plain":
        kwargs["data"] = tf.data.Dataset.from_tensor_slices((x, y)).batch(60)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        fdp_tf.make_private(_model(), optimizer=optimizer, loss=_loss(), verbose=False, **args)


def test_budget_parts_without_a_target_and_a_second_calibration_are_refused() -> None:
    with pytest.raises(ValueError, match="give target_epsilon with them"):
        fdp_tf.make_private(_model(), optimizer=fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0),
                            loss=_loss(), delta=DELTA)
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0)
    optimizer.calibrated(1.5)
    with pytest.raises(ValueError, match=r"left out at construction \(nothing\)"):
        optimizer.calibrated(2.0)
    jl = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"\(jl_projections\) calibrated.*'noise_multiplier': 2.0"):
        jl.calibrated(2.0)  # only what was left out
    jl.calibrated(jl_projections=7)
    assert jl.jl_projections == 7 and jl.missing_parameters() == ()
    with pytest.raises(ValueError, match=r"\(nothing\)"):
        jl.calibrated(jl_projections=8)
    with pytest.raises(ValueError, match=r"\(nothing\)"):
        fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0).calibrated(jl_projections=3)
