"""Models whose backward pass TensorFlow cannot differentiate (fdp_tf.second_order).

TensorFlow defines no gradient of ``SoftsignGrad``, so forward mode and the double vjp fail
on a ``softsign`` activation. Before the fix every private path of such a model crashed
while tracing with ``LookupError: gradient registry has no entry for: SoftsignGrad``: JL
with ``jvp_method="auto"`` (forward mode at r = 1), and with any method where the layer
taps do not take the model, even exact clipping by the per-example loop (the probe's
signature used the double vjp). Now the step traces again with first-order methods, each
example's contribution stays bounded, and an explicit second-order method is refused
naming the op.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import warnings

import keras
import numpy as np
import tensorflow as tf

import fdp_tf
from fdp_tf.second_order import missing_gradient, without_second_order
from test_tf_independence import _assert_contributions
from tf_helpers import CE

L = keras.layers


def _softsign_dense() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), L.Dense(4, activation="softsign"), L.Dense(3)])


def _softsign_lstm() -> keras.Model:
    # LayerNormalization: a layer the taps do not take, so no first-order shortcut is in reach
    return keras.Sequential([keras.Input((5, 3)), L.LSTM(4, activation="softsign", return_sequences=True),
                             L.LayerNormalization(), L.Flatten(), L.Dense(3)])


def _batch(shape: tuple[int, ...], n: int = 6):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, 3, size=n).astype("int32")


@pytest.mark.parametrize(("build", "shape", "kind", "kw", "retried"), [
    (_softsign_dense, (3,), "jl", {}, True),  # auto: forward mode at r = 1, then the loop
    (_softsign_dense, (3,), "jl", {"r": 3}, False),  # auto: the taps from the start
    (_softsign_lstm, (5, 3), "jl", {}, True),  # forward mode, then the per-example loop
    (_softsign_lstm, (5, 3), "exact", {"per_example_method": "loop"}, True),  # the probe's signature
    (_softsign_lstm, (5, 3), "exact", {}, True),
], ids=["dense-jl1", "dense-jl3", "lstm-layernorm-jl1", "lstm-layernorm-exact-loop", "lstm-layernorm-exact-auto"])
def test_a_model_without_second_derivatives_trains_with_bounded_contributions(build, shape, kind, kw, retried) -> None:
    x, y = _batch(shape)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _assert_contributions(build, x, y, kind, **kw)
    warned = [str(w.message) for w in caught if "'SoftsignGrad'" in str(w.message)]
    # once per model: _assert_contributions builds one and steps it three times
    assert len(warned) == int(retried), [str(w.message) for w in caught]


@pytest.mark.parametrize("method", ["forward", "double_vjp"])
def test_an_explicit_second_order_method_is_refused_naming_the_op(method: str) -> None:
    x, y = _batch((3,))
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=1, jvp_method=method,
                               expected_batch_size=len(x))
    model = fdp_tf.make_private(_softsign_dense(), optimizer=optimizer, loss=CE)
    start = [v.numpy().copy() for v in model.base_model.variables]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=rf"jvp_method='{method}'.*'SoftsignGrad'.*'auto'"):
            model.train_on_batch(x, y)
    # nothing was released: the weights did not move
    for v, s in zip(model.base_model.variables, start):
        np.testing.assert_array_equal(v.numpy(), s)
    assert int(optimizer.iterations.numpy()) == 0


def test_eagerly_the_step_is_retried_and_the_probe_left_no_trace() -> None:
    """run_eagerly=True: the probe's passes ran before the crash; the retry starts clean."""
    x, y = _batch((5, 3))
    optimizer = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=1,
                               expected_batch_size=len(x))
    inner = _softsign_lstm()
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=CE, run_eagerly=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.train_on_batch(x, y)
    assert without_second_order(inner) == "SoftsignGrad"
    assert optimizer.resolve_jvp_method(inner) == "loop"
    assert int(optimizer.iterations.numpy()) == 1


class _NoGradient(L.Layer):
    """A user's layer through an op with no first-order gradient in TensorFlow."""

    def call(self, inputs):
        return tf.raw_ops.SoftsignGrad(gradients=inputs, features=inputs)


def test_an_op_without_any_gradient_is_refused_with_what_to_do() -> None:
    """No gradient even to first order: the retry fails too, and the error says so."""
    x, y = _batch((3,))
    for optimizer in (fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=1,
                                     expected_batch_size=len(x)),
                      fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=len(x))):
        inner = keras.Sequential([keras.Input((3,)), L.Dense(4), _NoGradient(), L.Dense(3)])
        model = fdp_tf.make_private(inner, optimizer=optimizer, loss=CE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match="no gradient of the op 'SoftsignGrad'.*even with first-order"):
                model.train_on_batch(x, y)
        assert int(optimizer.iterations.numpy()) == 0


def test_the_missing_op_is_read_from_both_forms_of_the_error() -> None:
    assert missing_gradient(LookupError("gradient registry has no entry for: SoftsignGrad")) == "SoftsignGrad"
    nested = LookupError("No gradient defined for operation'gradients/x/SoftsignGrad' (op type: SoftsignGrad). "
                         "In general every operation must have an associated `@tf.RegisterGradient`")
    assert missing_gradient(nested) == "SoftsignGrad"
    assert missing_gradient(LookupError("something else")) is None
    assert missing_gradient(ValueError("gradient registry has no entry for: X")) is None
