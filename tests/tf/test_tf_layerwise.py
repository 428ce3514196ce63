"""Exact per-example norms layer by layer (per_example_method="layerwise") against the loop.

||g_i|| from activations and backpropagated gradients (Dense, Embedding, Conv2D, LSTM, GRU,
SimpleRNN, Bidirectional) must equal the norm of the per-example gradient computed one
example at a time, and the clipped gradient must be (1/B) sum_i c_i g_i.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from fdp_tf.layerwise import layerwise_norms, layerwise_unsupported
from tf_helpers import (
    bilstm_model,
    conv_model,
    dense_data,
    dense_model,
    flat,
    forward_fn,
    gru_model,
    image_data,
    loop_per_example_gradients,
    sequence_data,
)

L = keras.layers


def _seq(steps: int, *layers: keras.layers.Layer, vocab: int = 20, mask_zero: bool = False) -> keras.Model:
    return keras.Sequential(
        [keras.Input((steps,), dtype="int32"), L.Embedding(vocab, 6, mask_zero=mask_zero), *layers]
    )


MODELS = {
    "bilstm": lambda: bilstm_model(),
    "gru": lambda: gru_model(),
    "conv": lambda: conv_model(),
    "dense": lambda: dense_model(),
    "gru_reset_before_backwards_sequences": lambda: _seq(
        5, L.GRU(5, reset_after=False, go_backwards=True, return_sequences=True),
        L.Dense(3, activation="tanh"), L.Flatten(), L.Dense(2),
    ),
    "simple_rnn_no_bias_then_lstm": lambda: _seq(
        5, L.SimpleRNN(4, use_bias=False, return_sequences=True), L.LSTM(3), L.Dense(2),
    ),
    "bilstm_sum_masked": lambda: _seq(
        6, L.Bidirectional(L.LSTM(4, return_sequences=True), merge_mode="sum"),
        L.GlobalAveragePooling1D(), L.Dense(2), mask_zero=True,
    ),
    "conv1d_text": lambda: _seq(
        9, L.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu"),
        L.Conv1D(3, 2, strides=2, padding="same"), L.Conv1D(2, 2, padding="valid"),
        L.GlobalMaxPooling1D(), L.Dense(2),
    ),
    "conv_strided_same": lambda: keras.Sequential(
        [keras.Input((8, 8, 1)), L.Conv2D(3, 3, strides=2, padding="same", activation="relu"),
         L.Conv2D(2, 2, dilation_rate=2), L.Flatten(), L.Dense(3)]
    ),
}


def _data(name: str, n: int = 6):
    if name.startswith("conv") and name != "conv1d_text":
        return image_data(n=n)
    if name == "dense":
        return dense_data(n=n)
    steps = {"bilstm_sum_masked": 6, "conv1d_text": 9}.get(name, 5)
    x, y = sequence_data(n=n, steps=steps)
    if name == "bilstm_sum_masked":
        x[:3, :2] = 0  # padding at the start of some sequences
        x[3, -1] = 0  # and at the end of one
    return x, y


@pytest.mark.parametrize("name", list(MODELS))
def test_layerwise_norms_equal_loop(name: str) -> None:
    model = MODELS[name]()
    x, y = _data(name)
    assert layerwise_unsupported(model) is None
    recorded, norms, _, reason, covered = layerwise_norms(
        forward_fn(model, x, y, training=False), model.trainable_variables, model
    )
    assert reason is None
    assert bool(covered), "the coverage check must pass on a model the taps fully see"
    exact = loop_per_example_gradients(model, x, y)
    np.testing.assert_allclose(norms.numpy(), [np.linalg.norm(g) for g in exact], rtol=1e-4)
    # The recorded pass (RNNs run with the projection outside the loop) is the model's output.
    np.testing.assert_allclose(recorded.forward.outputs.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["bilstm", "conv"])
def test_layerwise_clipped_gradient_equals_example_by_example_sum(name: str) -> None:
    model = MODELS[name]()
    x, y = _data(name)
    clip, batch = 0.05, 8
    result = fdp_tf.vanilla_private_gradient(
        forward_fn(model, x, y, training=False), model.trainable_variables,
        l2_norm_clip=clip, noise_multiplier=0.0, expected_batch_size=batch,
        per_example_method="layerwise", model=model,
    )
    exact = loop_per_example_gradients(model, x, y)
    factors = result.clip_factors.numpy()
    assert factors.min() < 1.0
    np.testing.assert_allclose(factors, [min(1.0, clip / np.linalg.norm(g)) for g in exact], rtol=1e-4)
    expected = sum(c * g for c, g in zip(factors, exact)) / batch
    np.testing.assert_allclose(flat(result.gradients), expected, rtol=1e-4, atol=1e-7)


def test_layerwise_inside_tf_function_matches_eager() -> None:
    model = bilstm_model()
    x, y = _data("bilstm")
    variables = model.trainable_variables

    @tf.function
    def norms():
        return layerwise_norms(forward_fn(model, x, y, training=False), variables, model)[1]

    exact = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)]
    np.testing.assert_allclose(norms().numpy(), exact, rtol=1e-4)


def test_auto_picks_layerwise_only_for_supported_models() -> None:
    opt = fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=1.0)
    for build in (bilstm_model, gru_model, conv_model, dense_model):
        assert opt.resolve_per_example_method(build()) == "layerwise"
    normed = keras.Sequential([keras.Input((5,)), L.Dense(4), L.LayerNormalization(), L.Dense(2)])
    assert "layer_normalization" in layerwise_unsupported(normed)
    assert opt.resolve_per_example_method(normed) == "vectorized"
    dropout_lstm = _seq(5, L.LSTM(4, dropout=0.2), L.Dense(2))
    assert opt.resolve_per_example_method(dropout_lstm) == "loop"
    forced = fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, per_example_method="loop")
    assert forced.resolve_per_example_method(bilstm_model()) == "loop"


def test_layerwise_falls_back_when_a_layer_is_shared() -> None:
    """A layer called twice has a per-example gradient that is a sum over calls: fall back."""
    inputs = keras.Input((5,))
    shared = L.Dense(5, activation="tanh")
    outputs = L.Dense(3)(shared(shared(inputs)))
    model = keras.Model(inputs, outputs)
    x, y = dense_data(n=5)
    _assert_fallback_norms_exact(model, x, y, "called more than once")


def _assert_fallback_norms_exact(model: keras.Model, x, y, reason: str) -> None:
    """Forced "layerwise" warns ``reason``, falls back, and still gives the loop's norms."""
    with pytest.warns(RuntimeWarning, match=reason):
        result = fdp_tf.vanilla_private_gradient(
            forward_fn(model, x, y, training=False), model.trainable_variables,
            l2_norm_clip=1.0, noise_multiplier=0.0, expected_batch_size=len(x), per_example_method="layerwise", model=model,
        )
    expected = [np.linalg.norm(g) for g in loop_per_example_gradients(model, x, y)]
    np.testing.assert_allclose(result.norms.numpy(), expected, rtol=1e-4)


@pytest.mark.slow  # ~1.7 min: four traces through two LSTM loops
def test_fit_with_layerwise_trains_the_bilstm() -> None:
    x, y = sequence_data(n=64)
    model = fdp_tf.make_private(
        bilstm_model(),
        optimizer=fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=0.5, learning_rate=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    )
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=16, steps_per_epoch=4, seed=0)
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert model.optimizer.steps == 4


def test_time_distributed_is_not_taken_for_b_examples():
    """TimeDistributed folds time into the batch, so its inner Dense sees b*T rows: the
    layer-wise path must not use it (fallback, with the exact norms of the loop)."""
    model = keras.Sequential([
        keras.Input((4, 3)), L.TimeDistributed(L.Dense(2, activation="tanh")), L.Flatten(), L.Dense(2),
    ])
    assert "TimeDistributed" in layerwise_unsupported(model)
    opt = fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=1.0)
    assert opt.resolve_per_example_method(model) != "layerwise"
    rng = np.random.default_rng(0)
    for n in (1, 5):  # n = 1: b*T rows would broadcast against one loss
        x = rng.normal(size=(n, 4, 3)).astype("float32")
        y = rng.integers(0, 2, size=n)
        _assert_fallback_norms_exact(model, x, y, "TimeDistributed")


class _TiedOutput(keras.Model):
    """Logits h @ E^T with E the embedding table: E is read outside the Embedding's call."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = L.Embedding(20, 6)
        self.pool = L.GlobalAveragePooling1D()
        self.hidden = L.Dense(6, activation="tanh")

    def call(self, inputs, training=None):
        h = self.hidden(self.pool(self.embed(inputs)))
        return tf.matmul(h, self.embed.embeddings, transpose_b=True)[:, :2]


def test_tied_weights_are_not_taken_layerwise():
    """The taps see a variable only inside its own layer's call; a tied read elsewhere would
    give too small norms, so subclassed models (and Lambda layers) are not layer-wise."""
    model = _TiedOutput()
    x, y = sequence_data(n=5)
    model(x)
    assert "subclassed model" in layerwise_unsupported(model)
    assert fdp_tf.DPAdamVanilla(l2_norm_clip=1.0, noise_multiplier=1.0).resolve_per_example_method(model) != "layerwise"
    _assert_fallback_norms_exact(model, x, y, "subclassed model")
    lam = keras.Sequential([keras.Input((5,)), L.Dense(3), L.Lambda(lambda t: 2.0 * t), L.Dense(2)])
    assert "Lambda" in layerwise_unsupported(lam)
