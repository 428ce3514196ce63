"""Forward mode through Keras's recurrent loops: the JL projections in a tangent pass.

TensorFlow's forward-mode autodiff (``tf.autodiff.ForwardAccumulator``) cannot pass
through a ``tf.while_loop`` ("dtype variant is not compatible"), so a Keras LSTM, GRU or
SimpleRNN with ``unroll=False`` stops it. While :class:`RecurrentTangents` is active, each
such layer (also inside Bidirectional, stacked, masked, with an initial state) runs an
equivalent loop that carries the tangent beside the state. For the step function
s_t = F(s_{t-1}, X_t; U) of the cell (LSTM: s = (h, c); GRU, SimpleRNN: s = h), with
X_t = x_t K + b the input projection of the step:

    Xd_t = xd_t K + x_t V_K + V_b
    sd_t = dF/ds . sd_{t-1} + dF/dX . Xd_t + dF/dU . V_U

where (V_K, V_U, V_b) is the layer's share of the direction v and xd the tangent of its
input. The jvp of the step is taken by a ``ForwardAccumulator`` opened inside the loop
body over (s_{t-1}, X_t, U): it differentiates the same cell step the layer taps re-run
(:func:`fdp_tf.layerwise.recurrent.cell_step`, Keras's equations and gate order), so every
recurrence kind, activation and masking convention the taps handle gets its tangent from
one code path, and a masked step keeps state and tangent alike.

The loop itself is hidden from the outer accumulator (its inputs enter through
``tf.stop_gradient``); its outputs re-enter as out + s * out_dot, where s = 0 is a scalar
the outer accumulator watches with tangent 1: the primal is out, the tangent out_dot. The
layers around the loops (Embedding, Dense, the loss) are differentiated by the outer
accumulator as usual, so ``acc.jvp(losses)`` is P_i = <grad l_i, v> for every example,
with no tape. For r directions the pass runs under ``tf.vectorized_map`` over them: the
primal computation does not depend on the direction and runs once, the r tangents travel
together (:func:`tangent_projections`).

The pass records nothing for a backward pass: the clipped sum comes from a second,
ordinary forward and backward pass (:func:`recorded_tangent_projections`, the JL optimizers'
``jvp_method="forward"`` on a model with recurrent loops). Both passes start from
the same state of every Keras ``SeedGenerator``, so they draw the same dropout masks, and a
row whose loss differs between them gets no estimate (its norm is NaN: the step drops it,
a clipping to 0); gradients that differ with equal losses are caught on the released sum
(:meth:`TangentRecorded.consistent`, every step). No per-step, per-example tensor outlives
the pass, so for r = 1 the step's memory is about a non-private step's
(benchmarks/step_profile.py); it takes more time than the layer taps, which read everything
from one pass. For r > 1 the vectorized pass holds r tangents of every activation and costs
about r times the tangent pass of one direction (the primal recurrence runs once; the
tangents' products are r times one direction's): the taps are faster, this pass lighter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardFn, RecordedForward, raw_variables, record_forward
from fdp_tf.introspection import looped_rnn_layers, seed_states
from fdp_tf.layerwise.recurrent import cell_step, initial_states, recurrent_outputs, split_bias, time_major_mask
from fdp_tf.layerwise.support import tap_kind
from fdp_tf.refusals import Check, refuse_unless, repeated_later

__all__ = ["RecurrentTangents", "TangentRecorded", "recorded_tangent_projections", "tangent_projections",
           "tangent_support", "tangent_unsupported"]

#: two passes' losses of a row agree to this (the loop's products are ordered unlike Keras's)
LOSS_RTOL = 1e-4
#: the released sum's projection meets the projections' weighted sum to this (two modes of autodiff)
SUM_RTOL = 1e-3
MISMATCH = ("the JL projections of the tangent pass are not those of the gradients the taped pass "
            "released: the model computes something else when it is run again (state kept outside "
            "Keras's seed generators, e.g. a call counter in a tf.Variable). Use jvp_method='layerwise', "
            "which reads both from one pass")
RECURRENT_KINDS = ("lstm", "gru", "simple_rnn")


# static introspection of the model: plain Python, kept out of AutoGraph's conversion when a
# caller's tf.function traces it (an order-dependent wrong route was seen under pytest-xdist)
@tf.autograph.experimental.do_not_convert
def tangent_support(layer: Any) -> str | None:
    """None if :class:`RecurrentTangents` carries tangents through ``layer``'s loop (a plain
    Keras LSTM, GRU or SimpleRNN without cell dropout, not stateful), else why not."""
    kind = tap_kind(layer)
    if kind is None or kind[0] not in RECURRENT_KINDS:
        return (f"layer {layer.name!r} ({type(layer).__name__}) is not a plain Keras LSTM, GRU or SimpleRNN "
                "without dropout inside the cell")
    return None


@tf.autograph.experimental.do_not_convert
def tangent_unsupported(model: Any) -> str | None:
    """None when :class:`RecurrentTangents` carries every looped Keras RNN of ``model``
    (there is at least one), else why not."""
    looped = looped_rnn_layers(model)
    if not looped:
        return "the model has no looped Keras RNN"
    for layer in looped:
        reason = tangent_support(layer)
        if reason is not None:
            return reason
    return None


def _stopped(value: Any, dtype: Any) -> tf.Tensor:
    return tf.stop_gradient(tf.cast(tf.convert_to_tensor(value), dtype))


class RecurrentTangents:
    """Context manager: while active, the model's looped recurrent layers carry the tangent
    of ``accumulator`` (one direction) through their loops (module docstring).

    ``tangent_of`` maps ``id(variable)`` to its direction; ``seed`` is the scalar 0 the
    accumulator watches with tangent 1. A looped layer :func:`tangent_support` refuses runs
    as Keras's, and TensorFlow's forward mode then fails on its loop."""

    def __init__(self, model: Any, accumulator: tf.autodiff.ForwardAccumulator, tangent_of: dict[int, tf.Tensor],
                 seed: tf.Tensor) -> None:
        self.accumulator, self.tangent_of, self.seed = accumulator, tangent_of, seed
        self.layers = [layer for layer in looped_rnn_layers(model) if tangent_support(layer) is None]
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

    def _call(self, layer: Any) -> Callable[..., Any]:
        def call(sequences: tf.Tensor, initial_state: Any = None, mask: Any = None, training: Any = None) -> Any:
            return self._recurrent(layer, tap_kind(layer)[0], sequences, initial_state, mask)
        return call

    def _tangent(self, variable: Any, dtype: Any) -> tf.Tensor:
        """The variable's direction; 0 for one not differentiated (not trainable)."""
        tangent = self.tangent_of.get(id(variable))
        return tf.zeros(tuple(variable.shape), dtype) if tangent is None else tf.cast(tangent, dtype)

    def _with_tangent(self, value: Any, dtype: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """(value, its tangent under the outer accumulator), both hidden from it."""
        tangent = self.accumulator.jvp(value)
        value = _stopped(value, dtype)
        return value, tf.zeros_like(value) if tangent is None else _stopped(tangent, dtype)

    def _recurrent(self, layer: Any, kind: str, sequences: tf.Tensor, initial_state: Any, mask: Any) -> Any:
        cell, dtype = layer.cell, layer.compute_dtype
        x, x_dot = self._with_tangent(sequences, dtype)
        kernel, recurrent = _stopped(cell.kernel, dtype), _stopped(cell.recurrent_kernel, dtype)
        v_kernel, v_recurrent = self._tangent(cell.kernel, dtype), self._tangent(cell.recurrent_kernel, dtype)
        input_bias, recurrent_bias = split_bias(kind, cell, _stopped(cell.bias, dtype) if cell.use_bias else None)
        v_input_bias, v_recurrent_bias = split_bias(kind, cell, self._tangent(cell.bias, dtype) if cell.use_bias
                                                    else None)
        batch = tf.shape(x)[0]
        if initial_state is None:
            states = initial_states(kind, cell, None, batch, dtype)
            dots = [tf.zeros_like(s) for s in states]
        else:
            pairs = [self._with_tangent(s, dtype) for s in tf.nest.flatten(initial_state)]
            # distinct tensors: the step's accumulator refuses one primal given twice (h0 = c0)
            states, dots = [tf.identity(p[0]) for p in pairs], [p[1] for p in pairs]
        m = time_major_mask(layer, mask, batch)
        weights = [recurrent] + ([recurrent_bias] if recurrent_bias is not None else [])
        weight_dots = [v_recurrent] + ([v_recurrent_bias] if recurrent_bias is not None else [])
        n = len(states)
        steps = tf.shape(x)[1]
        keep = layer.return_sequences
        arrays = (tf.TensorArray(dtype, size=steps), tf.TensorArray(dtype, size=steps)) if keep else ()

        # X_t and Xd_t inside the loop, not for all steps before it: [b, T, gates] tensors
        # would outlive the loop (the memory a non-private step does not hold)
        def body(t: tf.Tensor, *carry: Any) -> tuple:
            state, dot, kept = list(carry[:n]), list(carry[n:2 * n]), carry[2 * n:]
            # read step t of the batch-major input and its tangent in place: a reversed or
            # time-major copy of the tangents ([r, b, T, d] under the directions' map) would
            # outlive the loop
            at = steps - 1 - t if layer.go_backwards else t
            x_t, xd_t = x[:, at], x_dot[:, at]
            proj = tf.linalg.matmul(x_t, kernel)
            proj_dot = tf.linalg.matmul(xd_t, kernel) + tf.linalg.matmul(x_t, v_kernel)
            if input_bias is not None:
                proj, proj_dot = proj + input_bias, proj_dot + v_input_bias
            with tf.autodiff.ForwardAccumulator(state + [proj] + weights, dot + [proj_dot] + weight_dots) as acc:
                h, c, _ = cell_step(kind, cell, recurrent, recurrent_bias, state[0], state[1] if n == 2 else None,
                                    proj)
            new = [h, c][:n]
            new_dot = [acc.jvp(v, unconnected_gradients=ZERO) for v in new]
            if m is not None:  # a masked step keeps the state and its tangent
                new = [tf.where(m[t], v, old) for v, old in zip(new, state)]
                new_dot = [tf.where(m[t], v, old) for v, old in zip(new_dot, dot)]
            if keep:
                kept = (kept[0].write(t, new[0]), kept[1].write(t, new_dot[0]))
            return (t + 1, *new, *new_dot, *kept)

        result = tf.while_loop(lambda t, *_: t < steps, body, (tf.constant(0), *states, *dots, *arrays))
        final, final_dot = result[1:1 + n], result[1 + n:1 + 2 * n]
        if keep:
            hs, hs_dot, mask_of = result[-2].stack(), result[-1].stack(), m
        else:  # the last output only: of a one-step sequence whose mask says what Keras's does
            hs, hs_dot = final[0][None], final_dot[0][None]
            mask_of = None if m is None else m[-1:] if layer.zero_output_for_mask else tf.reduce_any(
                m, axis=0, keepdims=True)
        seed = tf.cast(self.seed, dtype)
        # primal out, tangent out_dot (seed is 0 with tangent 1 under the accumulator)
        output = recurrent_outputs(layer, hs, mask_of) + seed * recurrent_outputs(layer, hs_dot, mask_of)
        if layer.return_state:
            return (output, *(v + seed * v_dot for v, v_dot in zip(final, final_dot)))
        return output


def _tangent_pass(forward_fn: ForwardFn, variables: Sequence[Any], model: Any,
                  direction: Sequence[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(P, l, <grad regularization, v>) of one tangent pass (0 without a regularization)."""
    seed = tf.zeros([])
    tangent_of = {id(v): d for v, d in zip(variables, direction)}
    with tf.autodiff.ForwardAccumulator(raw_variables(variables) + [seed], list(direction) + [tf.ones([])]) as acc:
        with RecurrentTangents(model, acc, tangent_of, seed):
            forward = forward_fn()
    losses = forward.per_example_losses
    projections = acc.jvp(losses)
    regularization = None if forward.regularization is None else acc.jvp(forward.regularization)
    return ((tf.zeros_like(losses) if projections is None else projections), losses,
            tf.zeros([], losses.dtype) if regularization is None else tf.cast(regularization, losses.dtype))


def _batched_tangent_pass(forward_fn: ForwardFn, variables: Sequence[Any], model: Any,
                          directions: Sequence[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(P [b, r], l [b], <grad regularization, v_j> [r]) for r directions (one ``[r, *shape]``
    tensor per variable) in one pass: the tangent pass vectorized over the directions
    (``tf.vectorized_map``), so the primal computation, which does not depend on the
    direction, runs once and the r tangents travel together through every layer and loop.
    An op the vectorization cannot batch raises rather than running the pass r times over
    (which would also advance Keras's seed generators r times)."""
    # the pass releases nothing and changes nothing: Keras variables (dropout seeds, moving
    # statistics) are read, their updates kept in the scope and dropped; its checks are the
    # taped pass's (repeated_later), which releases what they guard
    with keras.StatelessScope(collect_losses=True), repeated_later():
        if directions[0].shape[0] == 1:
            projections, losses, regularization = _tangent_pass(forward_fn, variables, model,
                                                                [d[0] for d in directions])
            return projections[:, None], losses, regularization[None]
        try:
            projections, losses, regularization = tf.vectorized_map(
                lambda direction: _tangent_pass(forward_fn, variables, model, list(direction)), tuple(directions),
                fallback_to_while_loop=False)
        except ValueError as err:
            if "No pfor vectorization defined" not in str(err):
                raise
            raise ValueError(
                f"jvp_method='forward' with jl_projections={directions[0].shape[0]} runs the model's forward "
                "pass vectorized over the directions (tf.vectorized_map), which cannot batch an op of it: "
                f"{str(err).splitlines()[0]} (e.g. state kept in a tf.Variable outside Keras). Use "
                "jvp_method='layerwise' or jl_projections=1") from err
    return tf.transpose(projections), losses[0], regularization


def tangent_projections(forward_fn: ForwardFn, variables: Sequence[Any], model: Any,
                        directions: Sequence[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """(P, l): P_ij = <grad l_i, v_j> for r directions ``directions`` (one ``[r, *shape]``
    tensor per variable), shape [b, r], by one forward pass in forward mode with the r
    tangents carried together through the recurrent loops, and the pass's per-example
    losses [b]. Nothing is recorded for a backward pass."""
    projections, losses, _ = _batched_tangent_pass(forward_fn, variables, model, directions)
    return projections, losses


@dataclass(frozen=True)
class TangentRecorded(RecordedForward):
    """The taped pass of :func:`recorded_tangent_projections`, its projections from the
    tangent pass before it, and what :meth:`consistent` needs of that pass."""

    direction: Sequence[tf.Tensor] = ()
    regularization_tangent: Any = None

    def __post_init__(self) -> None:
        if not self.direction or self.projections is None or self.regularization_tangent is None:
            raise ValueError("TangentRecorded needs the projections, the direction and the regularization's "
                             "tangent of its tangent pass")

    def consistent(self, clipped: Sequence[tf.Tensor], factors: tf.Tensor, batch: Any) -> list[Check]:
        """Refuse the step unless the released sum S = sum_i c_i g_i / B (+ the
        regularization's gradient) has the projections the tangent pass predicts, on
        every direction j:

            <S, v_j> = sum_i c_i P_ij / B + <grad regularization, v_j>

        Both sides are computed anyway; the two passes are only trusted to be one
        computation (M_i estimating the norm of the released g_i) if this holds. The v_j
        are secret and fresh each step, so a model that changes its gradients between the
        passes cannot aim its change at the directions checked. With r = 1 a clipped row
        has c_i P_i = +-C: on a step where every row is clipped and the signs balance,
        both sides are 0 and a change passes that step (for r > 1, c_i P_ij is not +-C)."""
        f64 = tf.float64
        # one matrix-vector product per variable: no [r, *shape] temporary (the route's point is
        # its memory); float32 products, summed over the variables in float64
        released = tf.add_n([tf.cast(tf.linalg.matvec(tf.reshape(d, [tf.shape(d)[0], -1]),
                                                      tf.reshape(tf.cast(tf.convert_to_tensor(g), d.dtype), [-1])), f64)
                             for g, d in zip(clipped, self.direction)])  # [r]
        c = tf.cast(factors, f64)[:, None]
        weighted = c * tf.cast(self.projections, f64) / tf.cast(batch, f64)  # [b, r]
        weighted = tf.where(c > 0, weighted, tf.zeros_like(weighted))  # P_i NaN: c_i = 0
        regularization = tf.cast(self.regularization_tangent, f64)
        predicted = tf.reduce_sum(weighted, axis=0) + regularization
        # relative to the terms' size, as the first-step method check (fdp_tf.probes): a
        # scale of sum_k |S_k v_k| would grow with sqrt(parameters) and let a gradient
        # scaled by 1.5 pass
        scale = tf.abs(released) + tf.reduce_sum(tf.abs(weighted), axis=0) + tf.abs(regularization)
        agree = tf.reduce_all(tf.abs(released - predicted) <= SUM_RTOL * scale + 1e-30)
        # a non-finite sum (a NaN row's 0 * NaN reaches every row) is not released: the step
        # reruns without the non-finite rows, checked again there, or stops (fdp_tf.nonfinite)
        finite = tf.reduce_all(tf.logical_and(tf.math.is_finite(released), tf.math.is_finite(predicted)))
        return refuse_unless(tf.logical_or(tf.logical_not(finite), agree), MISMATCH)


def recorded_tangent_projections(forward_fn: ForwardFn, variables: Sequence[Any], model: Any,
                                 directions: Sequence[tf.Tensor]) -> TangentRecorded:
    """The JL projections of r directions (``directions``: one ``[r, *shape]`` tensor per
    variable) by one tangent pass, then the same forward pass recorded on a tape for the
    clipped sum.

    The second pass starts from the Keras seed states the first started from, so both draw
    the same dropout masks, and it runs after the first (their peaks do not add). P_i
    estimates the norm of the gradient the tape gives only if row i computed the same thing
    twice: a row whose two losses differ by more than rounding (randomness drawn outside
    ``keras.random``) gets P_i = NaN, so the step drops it (c_i = 0); gradients that differ
    with equal losses are caught on the released sum (:meth:`TangentRecorded.consistent`).
    The tape is one-shot.
    """
    seeds = seed_states(model)
    start = [tf.identity(tf.convert_to_tensor(s)) for s in seeds]
    projections, first, regularization = _batched_tangent_pass(forward_fn, variables, model, directions)
    with tf.control_dependencies([projections, first]):
        for state, value in zip(seeds, start):
            state.assign(value)
        recorded = record_forward(forward_fn)
    losses = recorded.forward.per_example_losses
    first = tf.cast(first, losses.dtype)
    same = tf.abs(first - losses) <= LOSS_RTOL * (tf.abs(first) + tf.abs(losses)) + 1e-6
    projections = tf.where(same[:, None], tf.cast(projections, losses.dtype),
                           tf.constant(float("nan"), losses.dtype))
    return TangentRecorded(recorded.tape, recorded.forward, projections, tuple(directions), regularization)
