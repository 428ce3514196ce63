"""JL projections from the layer taps (``jvp_method="layerwise"``).

P_ij = <g_i, v_j> is read from each layer's input and backpropagated gradient, with no
tangent through the network or a recurrence. Checked against per-example gradients of
a plain pass (one backward pass per example, the same dropout masks) for every
recurrent kind the taps handle, inside Bidirectional, stacked, masked, under dropout,
for r = 1, 4, 16; the re-implemented recurrences against Keras's own outputs for every
option that changes them; the private step against its definition; and the fallback
when a weight escapes the taps.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("tensorflow")

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from fdp_tf.forward import record_forward
from fdp_tf.layerwise import (
    layerwise_pieces,
    layerwise_projections,
    layerwise_unsupported,
)
from fdp_tf.per_example import per_example_gradients
from fdp_tf.probes import seed_states
from tf_helpers import CE, flat, forward_fn, padded_tokens

L = keras.layers
STEPS, VOCAB = 6, 20


def _text_model(*layers: keras.layers.Layer, dropout: float = 0.0) -> keras.Model:
    middle = [L.Dropout(dropout)] if dropout else []
    return keras.Sequential([keras.Input((STEPS,), dtype="int32"), L.Embedding(VOCAB, 5, mask_zero=True),
                             *middle, *layers, L.Dense(3)])


MODELS = {
    "lstm": lambda: _text_model(L.LSTM(4)),
    "gru": lambda: _text_model(L.GRU(4)),
    "gru_reset_before": lambda: _text_model(L.GRU(4, reset_after=False, go_backwards=True)),
    "simple_rnn": lambda: _text_model(L.SimpleRNN(4, use_bias=False)),
    "bilstm_stacked": lambda: _text_model(
        L.Bidirectional(L.LSTM(3, return_sequences=True)), L.Bidirectional(L.GRU(3), merge_mode="sum")),
    "bilstm_dropout": lambda: _text_model(L.Bidirectional(L.LSTM(4)), L.Dense(4, activation="relu"),
                                          L.Dropout(0.3), dropout=0.3),
}


def _data(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    return padded_tokens(n, STEPS, VOCAB)


_STARTS: dict[int, list[np.ndarray]] = {}


def _replayed(model: keras.Model, run):
    """``run`` with every SeedGenerator of the model reset first to the state it had at the
    first call for this model: every pass draws the same dropout masks."""
    seeds = seed_states(model)
    start = _STARTS.setdefault(id(model), [s.numpy().copy() for s in seeds])

    def again():
        for s, value in zip(seeds, start):
            s.assign(value)
        return run()

    return again


def _reference_projections(model, x, y, directions) -> np.ndarray:
    """<g_i, v_j> from exact per-example gradients of a plain pass (one backward per example)."""
    variables = model.trainable_variables
    recorded = record_forward(_replayed(model, forward_fn(model, x, y, training=True)), persistent=True)
    grads = per_example_gradients(recorded, variables, vectorized=False)
    flat_g = np.concatenate([g.numpy().reshape(len(x), -1) for g in grads], axis=1).astype(np.float64)
    flat_v = np.concatenate([d.numpy().reshape(d.shape[0], -1) for d in directions], axis=1).astype(np.float64)
    return flat_g @ flat_v.T


@pytest.mark.parametrize("name", list(MODELS))
def test_projections_equal_per_example_gradients(name: str) -> None:
    model = MODELS[name]()
    x, y = _data()
    model(x)
    variables = model.trainable_variables
    assert layerwise_unsupported(model) is None
    for r in (1, 4, 16):
        directions = [tf.random.stateless_normal((r, *v.shape), seed=[r, k]) for k, v in enumerate(variables)]
        fwd = _replayed(model, forward_fn(model, x, y, training=True))
        found = layerwise_pieces(fwd, variables, model)
        assert found.reason is None and bool(found.covered)
        got = layerwise_projections(found.pieces, variables, directions,
                                    found.recorded.forward.per_example_losses).numpy()
        want = _reference_projections(model, x, y, directions)
        assert got.shape == (len(x), r)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _rnn_outputs_equal(kind: str, options: dict, zero_output: bool, masked: bool, with_state: bool) -> None:
    cls = {"lstm": L.LSTM, "gru": L.GRU, "simple_rnn": L.SimpleRNN}[kind]
    inputs = keras.Input((STEPS,), dtype="int32")
    seq = L.Embedding(VOCAB, 3, mask_zero=masked)(inputs)
    states = [L.Dense(4, activation="tanh")(L.GlobalAveragePooling1D()(seq))] * (2 if kind == "lstm" else 1)
    rnn = cls(4, **options)
    rnn.zero_output_for_mask = zero_output
    out = rnn(seq, initial_state=states) if with_state else rnn(seq)
    outs = out if isinstance(out, (list, tuple)) else [out]
    model = keras.Model(inputs, [L.Flatten()(o) if len(o.shape) == 3 else o for o in outs])
    x, _ = _data()
    found = layerwise_pieces(lambda: fdp_tf.ForwardPass(
        tf.zeros([len(x)]), None, model(x, training=False)), model.trainable_variables, model, check=False)
    assert found.reason is None
    for got, want in zip(tf.nest.flatten(found.recorded.forward.outputs), tf.nest.flatten(model(x))):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru", "simple_rnn"])
def test_recurrences_equal_keras_for_every_output_option(kind: str) -> None:
    """return_sequences, return_state, go_backwards, zero_output_for_mask, a mask, an
    initial state: every combination gives Keras's outputs and states."""
    for seqs, state, back, zero, masked, initial in itertools.product([False, True], repeat=6):
        options = dict(return_sequences=seqs, return_state=state, go_backwards=back)
        if kind == "gru":
            options["reset_after"] = not back  # both GRU variants, without doubling the cases
        try:
            _rnn_outputs_equal(kind, options, zero, masked, initial)
        except AssertionError as err:
            raise AssertionError(f"{kind} {options} zero_output_for_mask={zero} masked={masked} "
                                 f"initial_state={initial}") from err


def test_private_step_is_its_definition() -> None:
    """sigma = 0: the step releases sum_i min(1, C / M_i) g_i / B, g_i the per-example
    gradients of a plain pass, M_i the step's JL norms."""
    model = MODELS["bilstm_stacked"]()
    x, y = _data(8)
    model(x)
    variables = model.trainable_variables
    clip, batch = 0.05, 8
    result = fdp_tf.jl.layerwise_jl_gradient(
        forward_fn(model, x, y, training=False), variables, model, l2_norm_clip=clip,
        noise_multiplier=0.0, jl_projections=4, expected_batch_size=batch)
    factors = np.minimum(1.0, clip / result.norms.numpy())
    assert factors.min() < 1.0
    np.testing.assert_allclose(result.clip_factors.numpy(), factors, rtol=1e-6)
    recorded = record_forward(forward_fn(model, x, y, training=False), persistent=True)
    grads = per_example_gradients(recorded, variables, vectorized=False)
    per_example = np.concatenate([g.numpy().reshape(len(x), -1) for g in grads], axis=1)
    np.testing.assert_allclose(flat(result.gradients), factors @ per_example / batch, rtol=1e-4, atol=1e-7)
    assert int(result.fallbacks) == 0


def test_a_weight_that_escapes_the_taps_falls_back_to_the_double_vjp() -> None:
    """The kernel is also read through keras.ops: the taps do not see that use, the
    coverage check fails, and the step's norms and sum are those of the double vjp."""
    x_in = keras.Input((4,))
    dense = L.Dense(1, use_bias=False)
    model = keras.Model(x_in, dense(x_in[:, :2]) + keras.ops.matmul(x_in[:, 2:], dense.kernel))
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    variables = model.trainable_variables

    def linear_loss():
        out = model(x)
        return fdp_tf.ForwardPass(out[:, 0], None, out)

    result = fdp_tf.jl.layerwise_jl_gradient(
        linear_loss, variables, model, l2_norm_clip=1e6, noise_multiplier=0.0, jl_projections=3,
        expected_batch_size=5, rng=tf.random.Generator.from_seed(1))
    assert int(result.fallbacks) == 1
    g = x[:, :2] + x[:, 2:]  # example i's gradient, the escaped use included
    np.testing.assert_allclose(flat(result.gradients), g.sum(axis=0) / 5, rtol=1e-5)
    # finite, positive JL estimates of those gradients' norms
    ratios = result.norms.numpy() / np.linalg.norm(g, axis=1)
    assert np.all(np.isfinite(ratios)) and np.all(ratios > 0)


@pytest.mark.parametrize("r", [1, 4, 30])
def test_auto_picks_the_taps_for_every_recurrent_kind(r: int) -> None:
    optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=r)
    for name, build in MODELS.items():
        assert optimizer.resolve_jvp_method(build()) == "layerwise", name


def test_a_loop_the_taps_do_not_know_warns_once_naming_it() -> None:
    """An LSTM with recurrent dropout is not handled by the taps: the double vjp, with one
    warning that names the layer."""
    model = _text_model(L.LSTM(4, dropout=0.2, name="my_lstm"))
    optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=4)
    with pytest.warns(RuntimeWarning, match="'my_lstm'"):
        assert optimizer.resolve_jvp_method(model) == "double_vjp"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert optimizer.resolve_jvp_method(model) == "double_vjp"


@pytest.mark.slow
def test_fit_trains_the_bilstm_through_the_taps_and_books_every_step() -> None:
    x, y = _data(64)
    model = fdp_tf.make_private(
        MODELS["bilstm_dropout"](),
        optimizer=fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=8,
                                  learning_rate=0.01),
        loss=CE)
    assert model.optimizer.resolve_jvp_method(model.base_model) == "layerwise"
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=16, steps_per_epoch=4)
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert model.optimizer.steps == 4
    assert model.ledger.steps == 4 and model.ledger.segments[-1].jl_projections == 8
