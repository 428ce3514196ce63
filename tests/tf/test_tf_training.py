"""Every optimizer trains every kind of small model through ordinary ``fit``."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from tf_helpers import (
    CE,
    bilstm_model,
    conv_model,
    dense_data,
    dense_model,
    gru_model,
    image_data,
    on_indices,
    sequence_data,
)

DP = dict(l2_norm_clip=1.0, noise_multiplier=0.05, seed=3)

# SGD gets momentum for the BiLSTM, which plain SGD barely moves in 30 steps.
OPTIMIZERS = {
    "jl_sgd": lambda m=0.0: fdp_tf.DPSGDJL(jl_projections=1, learning_rate=0.5, momentum=m, **DP),
    "jl_adam": lambda m=0.0: fdp_tf.DPAdamJL(jl_projections=2, learning_rate=0.03, **DP),
    "vanilla_sgd": lambda m=0.0: fdp_tf.DPSGDVanilla(learning_rate=0.5, momentum=m, **DP),
    "vanilla_adam": lambda m=0.0: fdp_tf.DPAdamVanilla(learning_rate=0.03, **DP),
    "nondp_adam": lambda m=0.0: keras.optimizers.Adam(learning_rate=0.03),
}

MODELS = {
    "dense_dropout": (lambda: dense_model(inputs=5, hidden=16, dropout=0.2), lambda: dense_data(n=256)),
    "conv": (conv_model, lambda: image_data(n=192)),
    "bilstm": (bilstm_model, lambda: sequence_data(n=128)),
    "gru_dropout": (gru_model, lambda: sequence_data(n=128)),
    "gru_unrolled": (lambda: gru_model(unroll=True), lambda: sequence_data(n=128)),
}

# Second-order gradients through tf.while_loop RNNs take 5-20 s to trace, so the
# quick run keeps one case per code path and marks the rest slow.
FAST_RNN = {
    ("bilstm", "nondp_adam"),
    ("gru_dropout", "jl_sgd"),    # double vjp through a loop, r = 1, with dropout
    ("gru_unrolled", "jl_sgd"),   # forward mode through an unrolled GRU
    ("gru_unrolled", "vanilla_sgd"),
}  # the BiLSTM's DP cases (~1.5 min each: two LSTM loops) are slow
RNN_MODELS = {"bilstm", "gru_dropout", "gru_unrolled"}


def _cases():
    for model_name in MODELS:
        for opt_name in OPTIMIZERS:
            slow = model_name in RNN_MODELS and (model_name, opt_name) not in FAST_RNN
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(model_name, opt_name, id=f"{model_name}-{opt_name}", marks=marks)


@pytest.mark.parametrize("model_name,opt_name", list(_cases()))
def test_loss_falls(model_name: str, opt_name: str) -> None:
    build, data = MODELS[model_name]
    x, y = data()
    momentum = 0.9 if model_name == "bilstm" else 0.0
    model = fdp_tf.make_private(build(), optimizer=OPTIMIZERS[opt_name](momentum), loss=CE)
    before = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    batches = fdp_tf.poisson_batches(x, y, expected_batch_size=32, seed=0)
    history = model.fit(batches, epochs=8 if model_name in RNN_MODELS else 4, verbose=0)
    after = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    assert np.all(np.isfinite(history.history["loss"]))
    # Even non-private SGD moves this BiLSTM slowly (0.694 -> 0.670 in 32 steps).
    factor = 0.97 if model_name == "bilstm" and "sgd" in opt_name else 0.9
    assert after < factor * before, (before, after)
    if isinstance(model.optimizer, fdp_tf.DPOptimizer):
        assert model.optimizer.steps == int(model.optimizer.iterations.numpy()) > 0


def test_auto_strategy_per_model() -> None:
    jl1 = fdp_tf.DPAdamJL(jl_projections=1, **DP)
    jl5 = fdp_tf.DPAdamJL(jl_projections=5, **DP)
    vanilla = fdp_tf.DPAdamVanilla(**DP)
    assert jl1.resolve_jvp_method(dense_model()) == "auto"  # forward mode, double vjp at a loop
    assert jl1.resolve_jvp_method(gru_model(unroll=True)) == "auto"
    assert jl1.resolve_jvp_method(bilstm_model()) == "layerwise"  # the taps, through the loops
    assert jl5.resolve_jvp_method(dense_model()) == "layerwise"
    assert jl5.resolve_jvp_method(bilstm_model()) == "layerwise"
    normed = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.LayerNormalization(),
                               keras.layers.Dense(2)])
    assert jl1.resolve_jvp_method(normed) == "auto"
    assert jl5.resolve_jvp_method(normed) == "double_vjp"  # no taps for LayerNormalization
    assert vanilla.resolve_per_example_method(dense_model()) == "layerwise"
    assert vanilla.resolve_per_example_method(bilstm_model()) == "layerwise"
    normed = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4), keras.layers.BatchNormalization(), keras.layers.Dense(2)]
    )
    assert vanilla.resolve_per_example_method(normed) == "vectorized"


def test_one_step_with_zero_noise_and_huge_clip_equals_keras_sgd() -> None:
    """DP-SGD-JL and DP-SGD with sigma = 0, C = 1e6 take exactly Keras SGD's step."""
    x, y = dense_data(n=64)
    reference = dense_model()
    weights = reference.get_weights()
    reference.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    reference.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    for optimizer in (
        fdp_tf.DPSGDJL(l2_norm_clip=1e6, noise_multiplier=0.0, jl_projections=1, learning_rate=0.1),
        fdp_tf.DPSGDVanilla(l2_norm_clip=1e6, noise_multiplier=0.0, learning_rate=0.1),
    ):
        model = dense_model()
        model.set_weights(weights)
        private = fdp_tf.make_private(model, optimizer=optimizer, loss=CE)
        with pytest.warns(fdp_tf.SamplingWarning):
            private.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_metrics_and_evaluate_work_like_keras() -> None:
    x, y = dense_data(n=128)
    model = fdp_tf.make_private(
        dense_model(), optimizer=fdp_tf.DPAdamJL(jl_projections=1, learning_rate=0.03, **DP),
        loss=CE, metrics=["accuracy"],
    )
    history = model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=32, seed=1), epochs=2,
                        validation_data=(x, y), verbose=0)
    assert set(history.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    result = model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(result) == {"loss", "accuracy"}
    mean_ce = float(np.mean(CE(y, model.predict(x, verbose=0))))
    np.testing.assert_allclose(result["loss"], mean_ce, rtol=1e-5)


def test_sample_weights_scale_per_example_losses() -> None:
    x, y = dense_data(n=16)
    model = fdp_tf.make_private(dense_model(), optimizer=keras.optimizers.SGD(0.0), loss=CE)
    weights = np.linspace(0.0, 2.0, 16).astype("float32")
    result = model.evaluate(x, y, sample_weight=weights, batch_size=16, verbose=0, return_dict=True)
    expected = float(np.mean(weights * CE(y, model.predict(x, verbose=0)).numpy()))
    np.testing.assert_allclose(result["loss"], expected, rtol=1e-5)


def test_custom_training_loop_uses_public_gradient_path() -> None:
    x, y = dense_data(n=32)
    model = dense_model()
    optimizer = fdp_tf.DPSGDVanilla(learning_rate=0.1, **DP)

    def forward() -> fdp_tf.ForwardPass:
        out = model(x, training=True)
        return fdp_tf.ForwardPass(CE(y, out), None, out)

    with pytest.raises(ValueError, match="expected_batch_size is None"):
        optimizer.compute_private_gradients(forward, model.trainable_variables)
    optimizer.expected_batch_size = 32
    with pytest.raises(ValueError, match="forward_on_indices"):  # independence must be verifiable
        optimizer.compute_private_gradients(forward, model.trainable_variables)
    result = optimizer.compute_private_gradients(forward, model.trainable_variables,
                                                 forward_on_indices=on_indices(model, x, y))
    optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
    assert optimizer.steps == 1
    assert result.norms.shape == (32,)


def test_mixed_precision_is_refused_with_a_clear_error() -> None:
    """Keras wraps the optimizer in a LossScaleOptimizer under mixed precision, which would
    apply gradients that bypass the private clipping: refuse at compile, naming the policy."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inner = dense_model()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    with pytest.raises(ValueError, match="mixed precision .*mixed_float16"):
        fdp_tf.make_private(
            inner, optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        )


class _AddsLoss(keras.layers.Layer):
    """A layer whose add_loss term depends on the examples (its input)."""

    def call(self, inputs):
        self.add_loss(0.1 * keras.ops.mean(inputs ** 2))
        return inputs


@pytest.mark.parametrize("data_loss", [
    lambda: keras.layers.Dense(4, activity_regularizer="l2"),
    # nested, beside a weight regularizer: the penalties must not mask the data-dependent term
    lambda: keras.Sequential([_AddsLoss(), keras.layers.Dense(4, kernel_regularizer="l2")]),
], ids=["activity_regularizer", "nested_add_loss"])
def test_data_dependent_losses_are_refused(data_loss) -> None:
    """Their gradient depends on the examples and would not be clipped per example."""
    inner = keras.Sequential([keras.Input((5,)), data_loss(), keras.layers.Dense(2)])
    model = fdp_tf.make_private(
        inner, optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    x, y = dense_data(n=32, classes=2)
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=8, steps_per_epoch=1, seed=0)
    with pytest.raises(ValueError, match="add_loss or activity_regularizer"):
        model.fit(data, epochs=1, verbose=0)


def test_the_weight_penalty_is_the_sum_of_the_regularizers() -> None:
    """kernel and bias regularizers of nested layers, each counted once; none without them."""
    inner = keras.Sequential([keras.Input((5,)),
                              keras.Sequential([keras.layers.Dense(4, kernel_regularizer=keras.regularizers.L2(0.3),
                                                                   bias_regularizer=keras.regularizers.L1(0.2),
                                                                   bias_initializer="ones")]),
                              keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L1(0.5))])
    model = fdp_tf.make_private(
        inner, optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    w1, b1 = (v.numpy() for v in inner.layers[0].layers[0].weights)
    w2 = inner.layers[1].kernel.numpy()
    expected = 0.3 * np.sum(w1 ** 2) + 0.2 * np.sum(np.abs(b1)) + 0.5 * np.sum(np.abs(w2))
    assert float(model._regularization()) == pytest.approx(expected, rel=1e-6)
    plain = fdp_tf.make_private(
        keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)]),
        optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    assert plain._regularization() is None


def test_fdp_tf_calls_no_private_keras_method() -> None:
    """The adapter uses Keras's public API only (names Keras keeps private may change)."""
    import pathlib
    import re

    source = "\n".join(p.read_text() for p in pathlib.Path(fdp_tf.__file__).parent.glob("*.py"))
    private = set(re.findall(r"\b(?:layer|model|self|inner|keras[.\w]*)\.(_(?:get|flatten|tracker|losses)\w*)",
                             source))
    assert private == set(), f"private Keras names used: {sorted(private)}"


@pytest.mark.parametrize("method", ["vectorized", "loop", "layerwise"])
def test_weight_regularizer_trains_with_every_exact_method(method: str) -> None:
    inner = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, kernel_regularizer="l2"),
                              keras.layers.Dense(2)])
    model = fdp_tf.make_private(
        inner, optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5,
                                              per_example_method=method),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    x, y = dense_data(n=32, classes=2)
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=8, steps_per_epoch=2, seed=0)
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1]) and model.optimizer.steps == 2


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_custom_loop_in_tf_function_makes_autograph_warn_about_nothing() -> None:
    """A user's tf.function converts what it calls with AutoGraph, fdp_tf's step included:
    its Python helpers must be plain Python to AutoGraph or convert cleanly. 'Could not
    transform ... Please report this to the TensorFlow team' on a user's first trace (it
    was logged for the trace-slot bookkeeping) says something is broken when nothing is.
    AutoGraph warns once per function and process: tests/tf/test_tf_autograph.py converts
    every function of the package instead, whatever ran before."""
    x, y = dense_data(n=32)
    model = dense_model()
    dp = fdp_tf.DPSGDJL(jl_projections=1, learning_rate=0.1, **DP)
    dp.expected_batch_size = 32

    @tf.function
    def step() -> tf.Tensor:
        def forward() -> fdp_tf.ForwardPass:
            out = model(x, training=True)
            return fdp_tf.ForwardPass(CE(y, out), None, out)

        result = dp.compute_private_gradients(forward, model.trainable_variables,
                                              forward_on_indices=on_indices(model, x, y))
        dp.apply_gradients(zip(result.gradients, model.trainable_variables))
        return result.norms

    collect = _Collect()
    logger = tf.get_logger()
    logger.addHandler(collect)
    try:
        assert step().shape == (32,)
    finally:
        logger.removeHandler(collect)
    assert not [m for m in collect.messages if "AutoGraph" in m], collect.messages
