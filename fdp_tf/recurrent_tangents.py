"""Forward mode through Keras's LSTM loops: the JL projections in a tangent pass.

TensorFlow's forward-mode autodiff (``tf.autodiff.ForwardAccumulator``) cannot pass
through a ``tf.while_loop`` ("dtype variant is not compatible"), so a Keras LSTM with
``unroll=False`` stops it. While :class:`RecurrentTangents` is active, every plain
Keras LSTM of the model (also inside Bidirectional) runs an equivalent loop that carries
the tangent beside the state, one step at a time (the jvp of Keras's LSTM cell, gates
i, f, g, o in Keras's order):

    z_t  = x_t K + h_{t-1} U + b,                 zd_t = xd_t K + x_t V_K + hd_{t-1} U + h_{t-1} V_U + V_b
    i, f, o = sigmoid(z_i, z_f, z_o),  g = tanh(z_g);   di = i (1 - i) zd_i, ..., dg = (1 - g^2) zd_g
    c_t  = f c_{t-1} + i g,                        cd_t = df c_{t-1} + f cd_{t-1} + di g + i dg
    h_t  = o tanh(c_t),                            hd_t = do tanh(c_t) + o (1 - tanh(c_t)^2) cd_t

with (V_K, V_U, V_b) the layer's share of the direction v and xd the tangent of its input,
read from the accumulator. The loop itself is hidden from the accumulator (its inputs
enter through ``tf.stop_gradient``); its output re-enters as out + s * hd, where s = 0 is
a scalar the accumulator watches with tangent 1: the primal is out, the tangent hd. The
layers around it (Embedding, Dense, the loss) are differentiated by the accumulator as
usual, so ``acc.jvp(losses)`` is P_i = <grad l_i, v> for every example, with no tape
(:func:`tangent_projections`). On the seed's BiLSTM the pass takes 2.4-2.9x the time of
the model's ordinary forward pass (benchmarks/step_profile.py).

The pass records nothing for a backward pass: the clipped sum comes from a second,
ordinary forward and backward pass (benchmarks/step_profile.py measures the pair on the
seed's BiLSTM: peak memory 1.15-1.23x a non-private step at B = 256 and 64, where the
layer taps hold 3.1-3.2x; time 1.9-2.3x, where the taps take 1.4-1.6x).
Not yet a ``jvp_method`` of the optimizers: that needs the second pass to see the same
randomness as the first (the Keras seed states reset between them, as
:mod:`fdp_tf.probes` does) and the run-time method check of :mod:`fdp_tf.verify`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from fdp_tf.forward import ForwardFn, raw_variables
from fdp_tf.introspection import iter_layers

__all__ = ["RecurrentTangents", "lstm_tangent_support", "tangent_projections"]


def lstm_tangent_support(layer: Any) -> str | None:
    """None if :class:`RecurrentTangents` handles ``layer`` (a plain Keras LSTM), else why not."""
    if type(layer) is not keras.layers.LSTM or type(layer.cell) is not keras.layers.LSTMCell:
        return f"layer {layer.name!r} is not a plain keras.layers.LSTM"
    cell = layer.cell
    if cell.activation is not keras.activations.tanh or cell.recurrent_activation is not keras.activations.sigmoid:
        return f"LSTM {layer.name!r} has activations other than tanh and sigmoid"
    if layer.stateful or layer.return_state or cell.dropout or cell.recurrent_dropout:
        return f"LSTM {layer.name!r} is stateful, returns its state or uses dropout"
    return None


def _stopped(variable: Any, dtype: Any) -> tf.Tensor:
    return tf.stop_gradient(tf.cast(tf.convert_to_tensor(variable), dtype))


def _lstm_tangent_step(x: tf.Tensor, xd: tf.Tensor, h: tf.Tensor, c: tf.Tensor, hd: tf.Tensor, cd: tf.Tensor,
                       weights: tuple, tangents: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """One step of the LSTM and of its tangent (the module docstring's equations), in three
    products: [x; xd] K and [h; hd] U stacked over the batch, and [x, h] [V_K; V_U]."""
    kernel, recurrent, bias, v_bias = weights
    rows = tf.shape(x)[0]
    both = tf.linalg.matmul(tf.concat([x, xd], 0), kernel) + tf.linalg.matmul(tf.concat([h, hd], 0), recurrent)
    z, zd = both[:rows], both[rows:] + tf.linalg.matmul(tf.concat([x, h], 1), tangents)
    if bias is not None:
        z, zd = z + bias, zd + v_bias
    z_i, z_f, z_g, z_o = tf.split(z, 4, axis=-1)
    d_i, d_f, d_g, d_o = tf.split(zd, 4, axis=-1)
    i, f, o, g = tf.sigmoid(z_i), tf.sigmoid(z_f), tf.sigmoid(z_o), tf.tanh(z_g)
    di, df, do, dg = i * (1 - i) * d_i, f * (1 - f) * d_f, o * (1 - o) * d_o, (1 - g * g) * d_g
    c_new = f * c + i * g
    cd_new = df * c + f * cd + di * g + i * dg
    tanh_c = tf.tanh(c_new)
    return o * tanh_c, c_new, do * tanh_c + o * (1 - tanh_c * tanh_c) * cd_new, cd_new


class RecurrentTangents:
    """Context manager: while active, the model's plain LSTMs carry the tangent of
    ``accumulator`` (one direction) through their loop (module docstring).

    ``tangent_of`` maps ``id(variable)`` to its direction; ``seed`` is the scalar 0 the
    accumulator watches with tangent 1. Other recurrent layers (:func:`lstm_tangent_support`
    says why) run as Keras's, and TensorFlow's forward mode then fails on their loop."""

    def __init__(self, model: Any, accumulator: tf.autodiff.ForwardAccumulator, tangent_of: dict[int, tf.Tensor],
                 seed: tf.Tensor) -> None:
        self.accumulator, self.tangent_of, self.seed = accumulator, tangent_of, seed
        self.layers = [layer for layer in iter_layers(model)
                       if isinstance(layer, keras.layers.LSTM) and lstm_tangent_support(layer) is None]
        self._saved: list[Any] = []

    def __enter__(self) -> "RecurrentTangents":
        for layer in self.layers:
            self._saved.append(layer)
            object.__setattr__(layer, "call", self._call(layer))
        return self

    def __exit__(self, *exc: Any) -> None:
        for layer in reversed(self._saved):
            object.__delattr__(layer, "call")
        self._saved = []

    def _call(self, layer: Any) -> Callable[..., tf.Tensor]:
        def call(sequences: tf.Tensor, initial_state: Any = None, mask: Any = None, training: Any = None) -> tf.Tensor:
            if initial_state is not None or mask is not None:
                raise ValueError(f"forward mode through LSTM {layer.name!r}: an initial state or a mask is not "
                                 "supported yet; use jvp_method='layerwise'")
            return self._lstm(layer, sequences)
        return call

    def _tangent(self, variable: Any, dtype: Any) -> tf.Tensor:
        """The variable's direction; 0 for one not differentiated (not trainable)."""
        tangent = self.tangent_of.get(id(variable))
        return tf.zeros(tuple(variable.shape), dtype) if tangent is None else tf.cast(tangent, dtype)

    def _lstm(self, layer: Any, sequences: tf.Tensor) -> tf.Tensor:
        cell, dtype = layer.cell, layer.compute_dtype
        x_dot = self.accumulator.jvp(sequences)
        x = tf.stop_gradient(tf.cast(sequences, dtype))
        x_dot = tf.zeros_like(x) if x_dot is None else tf.stop_gradient(tf.cast(x_dot, dtype))
        if layer.go_backwards:
            x, x_dot = tf.reverse(x, [1]), tf.reverse(x_dot, [1])
        bias = _stopped(cell.bias, dtype) if cell.use_bias else None
        weights = (_stopped(cell.kernel, dtype), _stopped(cell.recurrent_kernel, dtype), bias,
                   self._tangent(cell.bias, dtype) if cell.use_bias else None)
        # [V_K; V_U]: the tangent's products with x_t and h_{t-1} in one
        tangents = tf.concat([self._tangent(cell.kernel, dtype), self._tangent(cell.recurrent_kernel, dtype)], 0)
        batch, steps = tf.shape(x)[0], tf.shape(x)[1]
        zeros = tf.zeros(tf.stack([batch, cell.units]), dtype)
        keep = layer.return_sequences
        outputs = (tf.TensorArray(dtype, size=steps), tf.TensorArray(dtype, size=steps)) if keep else ()

        def body(t: tf.Tensor, h: tf.Tensor, c: tf.Tensor, hd: tf.Tensor, cd: tf.Tensor, *arrays: Any) -> tuple:
            h, c, hd, cd = _lstm_tangent_step(x[:, t], x_dot[:, t], h, c, hd, cd, weights, tangents)
            if keep:
                arrays = (arrays[0].write(t, h), arrays[1].write(t, hd))
            return (t + 1, h, c, hd, cd, *arrays)

        result = tf.while_loop(lambda t, *_: t < steps, body, (tf.constant(0), zeros, zeros, zeros, zeros, *outputs))
        if keep:
            out, out_dot = (tf.transpose(a.stack(), [1, 0, 2]) for a in result[5:])
        else:
            out, out_dot = result[1], result[3]
        # primal out, tangent out_dot (seed is 0 with tangent 1 under the accumulator)
        return out + tf.cast(self.seed, dtype) * out_dot


def tangent_projections(forward_fn: ForwardFn, variables: Sequence[Any], model: Any,
                        direction: Sequence[tf.Tensor]) -> tf.Tensor:
    """P_i = <grad l_i, v> for one direction ``direction`` (one tensor per variable), by
    one forward pass in forward mode with the LSTMs' tangents carried in their loops;
    shape [b]. Nothing is recorded for a backward pass."""
    seed = tf.zeros([])
    tangent_of = {id(v): d for v, d in zip(variables, direction)}
    with tf.autodiff.ForwardAccumulator(raw_variables(variables) + [seed], list(direction) + [tf.ones([])]) as acc:
        with RecurrentTangents(model, acc, tangent_of, seed):
            losses = forward_fn().per_example_losses
    projections = acc.jvp(losses)
    return tf.zeros_like(losses) if projections is None else projections
