"""Forward mode through Keras's recurrent loops (fdp_tf.recurrent_tangents): the tangent
pass's P_i = <grad l_i, v> against exact per-example gradients (one backward pass each,
the same dropout masks) for every recurrent kind, inside Bidirectional, stacked, masked,
with an initial state and under dropout; the two-pass step (seed replay, the loss guard, the
per-step check of the released sum against the tangent pass, found needed by a red-team
search); what the run-time checks refuse on this route; and the optimizers' choice of it."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")

import threading
import warnings

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from fdp_tf import verify
from fdp_tf.forward import ForwardPass, record_forward
from fdp_tf.introspection import seed_states
from fdp_tf.jl import jl_norm_estimates, jl_private_gradient
from fdp_tf.per_example import per_example_gradients
from fdp_tf.recurrent_tangents import (TangentRecorded, recorded_tangent_projections, tangent_projections,
                                       tangent_support, tangent_unsupported)
from fdp_tf.refusals import refuse_unless, repeated_later
from tf_helpers import CE, padded_tokens

L = keras.layers
STEPS, VOCAB = 6, 20


def _text_model(*layers: keras.layers.Layer, masked: bool = True, dropout: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(3)
    middle = [L.Dropout(dropout)] if dropout else []
    return keras.Sequential([keras.Input((STEPS,), dtype="int32"), L.Embedding(VOCAB, 5, mask_zero=masked),
                             *middle, *layers, L.Dense(3)])


def _with_initial_state() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((STEPS,), dtype="int32")
    seq = L.Embedding(VOCAB, 3, mask_zero=True)(inputs)
    state = L.Dense(4, activation="tanh")(L.GlobalAveragePooling1D()(seq))
    out, h, c = L.LSTM(4, return_state=True, go_backwards=True)(seq, initial_state=[state, state])
    return keras.Model(inputs, L.Dense(3)(L.Concatenate()([out, c])))


def _zero_output_for_mask(layer: keras.layers.Layer) -> keras.layers.Layer:
    layer.zero_output_for_mask = True  # a masked last step outputs 0 (one row's is masked)
    return layer


MODELS = {
    "lstm": lambda: _text_model(L.LSTM(4)),
    "gru": lambda: _text_model(L.GRU(4)),
    "gru_reset_before": lambda: _text_model(L.GRU(4, reset_after=False, go_backwards=True)),
    "simple_rnn_relu": lambda: _text_model(L.SimpleRNN(4, use_bias=False, activation="relu")),
    "bilstm_stacked": lambda: _text_model(
        L.Bidirectional(L.LSTM(3, return_sequences=True)), L.Bidirectional(L.GRU(3), merge_mode="sum")),
    "bilstm_dropout_unmasked": lambda: _text_model(
        L.Bidirectional(L.LSTM(4, return_sequences=True)), L.LSTM(3, go_backwards=True, use_bias=False),
        L.Dense(4, activation="relu"), L.Dropout(0.3), masked=False, dropout=0.3),
    "initial_state": _with_initial_state,
    "zero_output_for_mask": lambda: _text_model(_zero_output_for_mask(L.SimpleRNN(4)), L.Dense(3, activation="tanh")),
}


def _data(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    return padded_tokens(n, STEPS, VOCAB)


def _forward(model: keras.Model, x: np.ndarray, y: np.ndarray):
    """The training pass, every call from the seed states of the first call (same masks)."""
    seeds = seed_states(model)
    start = [s.numpy().copy() for s in seeds]

    def run() -> ForwardPass:
        for s, value in zip(seeds, start):
            s.assign(value)
        return ForwardPass(CE(y, model(x, training=True)))

    return run


def _reference(model: keras.Model, forward, directions: list[tf.Tensor]) -> np.ndarray:
    """[b, r]: <g_i, v_j> from exact per-example gradients, one backward pass each."""
    variables = model.trainable_variables
    grads = per_example_gradients(record_forward(forward, persistent=True), variables, vectorized=False)
    return sum(g.numpy().reshape(len(g), -1).astype(np.float64)
               @ d.numpy().reshape(len(d), -1).astype(np.float64).T for g, d in zip(grads, directions))


def _check_projections(model: keras.Model, r: int, seed: int) -> None:
    x, y = _data()
    model(x)
    assert tangent_unsupported(model) is None
    variables = model.trainable_variables
    forward = _forward(model, x, y)
    directions = [tf.random.stateless_normal((r, *v.shape), seed=[seed, j]) for j, v in enumerate(variables)]
    got, losses = tf.function(lambda: tangent_projections(forward, variables, model, directions))()
    want = _reference(model, forward, directions)
    assert got.shape == want.shape == (len(x), r)
    np.testing.assert_allclose(losses.numpy(), forward().per_example_losses.numpy(), rtol=1e-5)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert np.min(np.abs(want)) > 1e-5  # projections that say something


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("r", [1, 4])
def test_tangent_pass_matches_exact_per_example_projections(name: str, r: int) -> None:
    _check_projections(MODELS[name](), r, seed=r)


@pytest.mark.parametrize("name", ["bilstm_dropout_unmasked", "initial_state"])
def test_sixteen_directions_travel_together(name: str) -> None:
    """r tangents in one vectorized pass: under dropout (the masks drawn once, not per
    direction) and with masks and an initial state."""
    _check_projections(MODELS[name](), 16, seed=16)


def test_unsupported_layers_are_named() -> None:
    assert tangent_support(L.LSTM(3, dropout=0.1)) is not None
    assert tangent_support(L.GRU(3, stateful=True)) is not None
    assert tangent_support(L.RNN(L.LSTMCell(3))) is not None
    for layer in (L.LSTM(3, activation="relu"), L.GRU(3), L.SimpleRNN(3)):
        layer.build((None, STEPS, 2))
        assert tangent_support(layer) is None
    assert "no looped" in tangent_unsupported(_text_model(L.LSTM(3, unroll=True)))


def _weighted_identity(model: keras.Model, forward) -> tuple[np.ndarray, float, float]:
    """(P, sum_i w_i P_i, <grad sum_i w_i l_i, v>) of the two-pass route, w_i = 1 + i: P
    must be the projections of the gradients the step's tape gives (same dropout masks)."""
    variables = model.trainable_variables
    direction = [tf.random.stateless_normal((1, *v.shape), seed=[5, j]) for j, v in enumerate(variables)]

    @tf.function
    def run():
        recorded, norms = jl_norm_estimates(forward, variables, 1, jvp_method="forward", directions=direction,
                                            model=model)
        losses = recorded.forward.per_example_losses
        w = 1.0 + tf.range(tf.shape(losses)[0], dtype=losses.dtype)
        grads = recorded.tape.gradient(losses, variables, output_gradients=w)
        truth = tf.add_n([tf.reduce_sum(tf.convert_to_tensor(g) * d[0]) for g, d in zip(grads, direction)])
        projections = recorded.projections[:, 0]
        return projections, tf.reduce_sum(w * projections), truth

    projections, mine, truth = (t.numpy() for t in run())
    return projections, float(mine), float(truth)


def test_the_taped_pass_replays_the_tangent_pass_dropout_masks() -> None:
    model = MODELS["bilstm_dropout_unmasked"]()
    x, y = _data()
    model(x)
    projections, mine, truth = _weighted_identity(model, lambda: ForwardPass(CE(y, model(x, training=True))))
    assert np.all(np.isfinite(projections))
    assert abs(mine - truth) <= 1e-4 * (np.sum(np.abs(projections)) + abs(truth))


class _UnseededNoise(L.Layer):
    """Randomness drawn outside keras.random: no seed state replays it."""

    def call(self, inputs, training=None):
        return inputs + tf.random.uniform(tf.shape(inputs)) if training else inputs


def test_a_row_the_second_pass_computes_otherwise_gets_no_estimate() -> None:
    model = _text_model(_UnseededNoise(), L.LSTM(3), masked=False)
    x, y = _data()
    model(x)
    projections, _, _ = _weighted_identity(model, lambda: ForwardPass(CE(y, model(x, training=True))))
    assert np.all(np.isnan(projections))  # the step drops these rows: c_i = 0


class _Scale(L.Layer):
    """A weight the layer taps do not know (so ``auto`` cannot take them)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        return inputs * self.scale


@pytest.mark.parametrize("r", [1, 5])
def test_auto_takes_forward_mode_where_the_taps_cannot(r: int) -> None:
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8, jl_projections=r)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no double-vjp warning, whatever r
        assert optimizer.resolve_jvp_method(_text_model(L.Bidirectional(L.GRU(3)), _Scale())) == "auto"
    assert optimizer.resolve_jvp_method(_text_model(L.GRU(3))) == "layerwise"  # faster, more memory
    with pytest.warns(RuntimeWarning, match="double vjp"):  # a loop forward mode cannot carry
        optimizer.resolve_jvp_method(_text_model(L.GRU(3, dropout=0.1), _Scale()))


@pytest.mark.parametrize("r", [1, 3])
def test_fit_trains_through_the_loops_in_forward_mode(r: int) -> None:
    model = _text_model(L.GRU(3), L.Dropout(0.2))
    x, y = _data(16)
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8, learning_rate=0.1,
                               jl_projections=r, jvp_method="forward")
    private = fdp_tf.PrivateModel(model)
    private.compile(optimizer=optimizer, loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        history = private.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@tf.custom_gradient
def _mixing_gradient(x: tf.Tensor):
    """The identity forward; backward, every row's gradient gets the batch's mean added."""
    return tf.identity(x), lambda dy: dy + tf.reduce_mean(dy, axis=0, keepdims=True)


class _MixesGradients(L.Layer):
    def call(self, inputs):
        return _mixing_gradient(inputs)


def test_rows_that_interact_through_their_gradients_are_refused() -> None:
    """The tangent pass sees the forward pass only; what is released comes from the
    backward pass. The step's checks must read that one (a probe whose signatures came
    from a tangent pass trained this model with jvp_method='auto'; with 'forward' the
    method check refuses it, as it refuses forward mode through any custom gradient)."""
    model = _text_model(_MixesGradients(), L.GRU(3), _Scale(), masked=False)
    dp = dict(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8, learning_rate=0.1, jl_projections=1)
    assert verify.methods(fdp_tf.DPSGDJL(jvp_method="forward", **dp), model) == ("jl", "forward", None)
    optimizer = fdp_tf.DPSGDJL(**dp)
    assert verify.methods(optimizer, model) == ("jl", "auto", "loop")  # not the double vjp through the loop
    x, y = _data(16)
    private = fdp_tf.PrivateModel(model)
    private.compile(optimizer=optimizer, loss=CE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="changed when other examples of the batch changed"):
            private.fit(x, y, batch_size=8, epochs=1, verbose=0)


class _AlternatingGradientScale(L.Layer):
    """The identity forward; its derivative (forward and reverse mode) is 1 on odd calls and
    1.5 on even ones, from Python state no seed reset restores (a red-team search found the
    same with 30)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls = 0

    def call(self, inputs):
        self.calls += 1
        scale = 1.0 if self.calls % 2 else 1.5
        return tf.stop_gradient(inputs) + (inputs - tf.stop_gradient(inputs)) * scale


def test_two_passes_that_differ_only_in_their_gradients_are_refused() -> None:
    """Equal losses, so no row gets a NaN estimate; the released sum's projection on the
    step's direction shows the taped pass's gradients are 1.5x those whose norms were
    estimated (the step would release terms of norm 1.5 C). C is large (nothing clipped):
    with every row clipped and r = 1, c_i P_i = +-C, and on a step where as many are
    positive as negative both sides of the check are 0 (such a step is not caught; the
    next unbalanced one is). A seeded generator makes the direction the same on every run."""
    model = _text_model(L.LSTM(3), _AlternatingGradientScale(), masked=False)
    x, y = _data(8)
    model(x)
    with pytest.raises(ValueError, match="not those of the gradients the taped pass released"):
        jl_private_gradient(lambda: ForwardPass(CE(y, model(x, training=True))), model.trainable_variables,
                            l2_norm_clip=100.0, noise_multiplier=1.0, jl_projections=1, expected_batch_size=8,
                            rng=tf.random.Generator.from_seed(1), jvp_method="forward", model=model)


def test_with_several_directions_a_change_is_seen_when_every_row_is_clipped() -> None:
    """With r = 1 a clipped row's c_i P_i is +-C, and a step whose signs balance shows no
    change (the gap the test above avoids by clipping nothing); with r > 1, c_i P_ij is
    not +-C, and the check on every direction refuses the 1.5x gradients with every row
    clipped."""
    model = _text_model(L.LSTM(3), _AlternatingGradientScale(), masked=False)
    x, y = _data(8)
    model(x)
    forward = lambda: ForwardPass(CE(y, model(x, training=True)))  # noqa: E731
    recorded, norms = jl_norm_estimates(forward, model.trainable_variables, 3, jvp_method="forward", model=model)
    assert float(tf.reduce_min(norms)) > 1e-3  # C = 1e-4 clips every row
    with pytest.raises(ValueError, match="not those of the gradients the taped pass released"):
        jl_private_gradient(forward, model.trainable_variables, l2_norm_clip=1e-4, noise_multiplier=1.0,
                            jl_projections=3, expected_batch_size=8, rng=tf.random.Generator.from_seed(1),
                            jvp_method="forward", model=model)


@pytest.mark.parametrize("wrong", [1, 2])
def test_the_released_sum_is_checked_on_every_direction(wrong: int) -> None:
    """Projections right on direction 0 and 1.5x on one other: the check must refuse (one
    that read only the first direction would pass). Exact arithmetic on chosen values: the
    test of the check alone, without a model."""
    rng = np.random.default_rng(0)
    b, r, shapes = 5, 3, [(4, 3), (3,)]
    grads = [rng.normal(size=(b, *s)).astype(np.float32) for s in shapes]
    directions = [tf.constant(rng.normal(size=(r, *s)).astype(np.float32)) for s in shapes]
    projections = sum(g.reshape(b, -1).astype(np.float64) @ d.numpy().reshape(r, -1).T.astype(np.float64)
                      for g, d in zip(grads, directions))  # [b, r]
    factors = np.array([1.0, 0.5, 0.25, 1.0, 0.0])
    released = [tf.constant(np.tensordot(factors, g, axes=1) / b, tf.float32) for g in grads]
    with tf.GradientTape() as tape:
        forward = ForwardPass(tf.zeros([b]))

    def check(p: np.ndarray) -> None:
        recorded = TangentRecorded(tape, forward, tf.constant(p, tf.float32), tuple(directions), tf.zeros([]))
        recorded.consistent(released, tf.constant(factors, tf.float32), b)

    check(projections)  # the true projections pass
    changed = projections.copy()
    changed[:, wrong] *= 1.5
    with pytest.raises(ValueError, match="not those of the gradients the taped pass released"):
        check(changed)


def test_the_tangent_pass_leaves_moving_statistics_alone() -> None:
    """A BatchNormalization's moving statistics move once per step, in the taped pass: the
    tangent pass before it reads them and drops its updates (keras.StatelessScope)."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((STEPS,), dtype="int32"), L.Embedding(VOCAB, 5), L.BatchNormalization(),
                              L.LSTM(4), L.Dense(3)])
    x, y = _data(8)
    model(x)
    moving = [w for w in model.non_trainable_variables if "moving" in w.path]
    start = [w.numpy().copy() for w in moving]
    forward = lambda: ForwardPass(CE(y, model(x, training=True)))  # noqa: E731
    forward()
    once = [w.numpy().copy() for w in moving]
    assert not all(np.allclose(a, b) for a, b in zip(start, once))  # a step moves them
    for w, value in zip(moving, start):
        w.assign(value)
    variables = model.trainable_variables
    for r in (1, 3):
        directions = [tf.random.stateless_normal((r, *v.shape), seed=[r, j]) for j, v in enumerate(variables)]
        tf.function(lambda: recorded_tangent_projections(forward, variables, model, directions).projections)()
        for w, want, value in zip(moving, once, start):
            np.testing.assert_allclose(w.numpy(), want, rtol=1e-6, atol=1e-7)
            w.assign(value)


def test_a_row_with_a_nan_loss_is_dropped_not_the_step_refused() -> None:
    """A row masked entirely gives 0 / 0 in a masked average: its loss is NaN, which makes
    the taped pass's sum NaN. The step reruns without it (fdp_tf.nonfinite); the check of
    the released sum must not refuse the NaN sum it will never release."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((STEPS,), dtype="int32"), L.Embedding(VOCAB, 5, mask_zero=True),
                              L.GRU(4, return_sequences=True), L.GlobalAveragePooling1D(), L.Dense(3)])
    x, y = _data(8)
    x[1] = 0
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8, learning_rate=0.1,
                               jl_projections=1, jvp_method="forward")
    private = fdp_tf.PrivateModel(model)
    private.compile(optimizer=optimizer, loss=CE, run_eagerly=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private.train_on_batch(x, y)
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


def test_a_deferred_check_is_dropped_in_its_own_thread_only() -> None:
    """The tangent pass traces its checks away (the taped pass repeats them); a distribution
    strategy traces replicas in threads at once, so another thread's checks must stay."""
    added: dict[str, int] = {}

    def trace(name: str) -> None:
        tf.function(lambda x: added.setdefault(name, len(refuse_unless(x > 0, "m"))) and x)(tf.constant(1.0))

    with repeated_later():
        trace("inside")
        other = threading.Thread(target=trace, args=("other thread",))
        other.start()
        other.join()
    trace("after")
    assert added == {"inside": 0, "other thread": 1, "after": 1}
