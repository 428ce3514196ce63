"""Bad inputs raise ValueError naming the argument; skipped DP paths fail loudly."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from tf_helpers import CE, dense_data, dense_model, on_indices

GOOD = dict(l2_norm_clip=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("cls", [fdp_tf.DPSGDJL, fdp_tf.DPAdamJL])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, float("nan"), "3"])
def test_bad_jl_projections(cls, value) -> None:
    with pytest.raises(ValueError, match="jl_projections"):
        cls(jl_projections=value, **GOOD)


ALL = [
    lambda **k: fdp_tf.DPSGDJL(jl_projections=1, **k),
    lambda **k: fdp_tf.DPAdamJL(jl_projections=1, **k),
    lambda **k: fdp_tf.DPSGDVanilla(**k),
    lambda **k: fdp_tf.DPAdamVanilla(**k),
]


@pytest.mark.parametrize("make", ALL)
@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(l2_norm_clip=1.0, noise_multiplier=-0.1), "noise_multiplier"),
        (dict(l2_norm_clip=1.0, noise_multiplier=float("nan")), "noise_multiplier"),
        (dict(l2_norm_clip=0.0, noise_multiplier=1.0), "l2_norm_clip"),
        (dict(l2_norm_clip=-2.0, noise_multiplier=1.0), "l2_norm_clip"),
        (dict(l2_norm_clip=float("inf"), noise_multiplier=1.0), "l2_norm_clip"),
        (dict(expected_batch_size=0, **GOOD), "expected_batch_size"),
    ],
)
def test_bad_clip_noise_batch(make, kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        make(**kwargs)


def test_bad_methods() -> None:
    with pytest.raises(ValueError, match="jvp_method"):
        fdp_tf.DPSGDJL(jl_projections=1, jvp_method="reverse", **GOOD)
    nested = fdp_tf.DPSGDJL(jl_projections=3, jvp_method="forward", **GOOD)  # r tangents through loops only
    with pytest.raises(ValueError, match="jvp_method='forward' with jl_projections=3 > 2 needs a model"):
        nested.resolve_jvp_method(dense_model())
    with pytest.raises(ValueError, match="per_example_method"):
        fdp_tf.DPSGDVanilla(per_example_method="magic", **GOOD)


def test_missing_required_arguments() -> None:
    with pytest.raises(TypeError):
        fdp_tf.DPAdamJL(noise_multiplier=1.0, jl_projections=3)  # l2_norm_clip is required
    # r may be left out for make_private to choose (a budget), but nothing trains without it
    optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="jl_projections of DPAdamJL is None"):
        fdp_tf.PrivateModel(dense_model()).compile(optimizer=optimizer, loss=CE)


@pytest.mark.parametrize(
    "loss",
    [
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        keras.losses.MeanSquaredError(reduction="sum"),
        keras.losses.CategoricalCrossentropy(reduction="mean"),
        "SparseCategoricalCrossentropy",
    ],
)
def test_reduced_loss_is_refused_naming_the_loss(loss) -> None:
    with pytest.raises(ValueError, match=r"loss .*reduction="):
        fdp_tf.make_private(dense_model(), optimizer=fdp_tf.DPSGDJL(jl_projections=1, **GOOD), loss=loss)
    with pytest.raises(ValueError, match=r"loss .*reduction="):  # compile on PrivateModel directly
        fdp_tf.PrivateModel(dense_model()).compile(optimizer=fdp_tf.DPAdamVanilla(**GOOD), loss=loss)


def test_loss_function_returning_a_scalar_is_refused_at_fit() -> None:
    def mean_ce(y, y_pred):
        return tf.reduce_mean(CE(y, y_pred))

    x, y = dense_data(n=16)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDJL(jl_projections=1, **GOOD), loss=mean_ce
    )
    with pytest.raises(ValueError, match="loss mean_ce returned a scalar"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=4, seed=0), epochs=1, verbose=0)


def test_string_per_example_loss_is_accepted() -> None:
    x, y = dense_data(n=16)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPSGDVanilla(**GOOD), loss="sparse_categorical_crossentropy"
    )
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=4, seed=0), epochs=1, verbose=0)


def test_missing_or_multi_loss() -> None:
    with pytest.raises(ValueError, match="loss must be given"):
        fdp_tf.make_private(dense_model(), optimizer=fdp_tf.DPSGDVanilla(**GOOD))
    with pytest.raises(ValueError, match="loss must be a single"):
        fdp_tf.make_private(dense_model(), optimizer=fdp_tf.DPSGDVanilla(**GOOD), loss=[CE, CE])
    with pytest.raises(ValueError, match="optimizer must be given"):
        fdp_tf.make_private(dense_model(), loss=CE)


def test_model_without_trainable_variables() -> None:
    frozen = dense_model()
    frozen.trainable = False
    with pytest.raises(ValueError, match="model .* no trainable variables"):
        fdp_tf.make_private(frozen, optimizer=fdp_tf.DPSGDVanilla(**GOOD), loss=CE)
    optimizer = fdp_tf.DPSGDVanilla(**GOOD)
    with pytest.raises(ValueError, match="variables"):
        optimizer.compute_private_gradients(lambda: None, [])
    with pytest.raises(ValueError, match="model must be a Keras model"):
        fdp_tf.PrivateModel("not a model")


def test_unbuilt_model_without_trainable_variables_fails_at_the_first_step() -> None:
    """Variables of an unbuilt model are unknown at wrap time; fit checks again."""
    x, y = dense_data(n=16)
    model = fdp_tf.make_private(
        keras.Sequential([keras.layers.Flatten()]), optimizer=fdp_tf.DPSGDJL(jl_projections=1, **GOOD),
        loss=CE,
    )
    with pytest.raises(ValueError, match="no trainable variables"):
        model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=4, seed=0), epochs=1, verbose=0)


def test_plain_keras_model_with_dp_optimizer_fails_loudly() -> None:
    x, y = dense_data(n=16)
    model = dense_model()
    model.compile(optimizer=fdp_tf.DPAdamJL(jl_projections=1, **GOOD), loss=CE)
    with pytest.raises(RuntimeError, match="clipping and noise were skipped"):
        model.fit(x, y, epochs=1, verbose=0)


def test_apply_refuses_gradients_not_from_the_private_path() -> None:
    x, y = dense_data(n=8)
    model = dense_model()
    variables = model.trainable_variables
    optimizer = fdp_tf.DPSGDVanilla(**GOOD, expected_batch_size=8)
    zeros = [tf.zeros_like(v) for v in variables]
    with pytest.raises(RuntimeError, match="compute_private_gradients"):
        optimizer.apply_gradients(zip(zeros, variables))

    def forward() -> fdp_tf.ForwardPass:
        out = model(x, training=True)
        return fdp_tf.ForwardPass(CE(y, out), None, out)

    rows = on_indices(model, x, y)
    optimizer.compute_private_gradients(forward, variables, forward_on_indices=rows)
    with pytest.raises(RuntimeError):  # other tensors than the private ones
        optimizer.apply_gradients(zip(zeros, variables))
    result = optimizer.compute_private_gradients(forward, variables, forward_on_indices=rows)
    optimizer.apply_gradients(zip(result.gradients, variables))
    with pytest.raises(RuntimeError):  # each private gradient is applied at most once
        optimizer.apply_gradients(zip(result.gradients, variables))
    assert optimizer.steps == 1


def test_forward_fn_must_return_forward_pass() -> None:
    model = dense_model()
    with pytest.raises(TypeError, match="ForwardPass"):
        fdp_tf.record_forward(lambda: model(np.zeros((2, 5), np.float32)))
