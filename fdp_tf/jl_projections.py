"""The JL projections P_ij = <g_i, v_j> of every example's gradient on r directions,
by forward mode and by the double vjp (seed, Section "Jacobian-vector product").

:func:`fdp_tf.jl.jl_norm_estimates` chooses between them (and the layer taps of
:mod:`fdp_tf.layerwise`, the loops of :mod:`fdp_tf.recurrent_tangents`); both read the
projections from, or next to, the recorded forward pass whose tape gives the clipped sum.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardFn, RecordedForward, check_forward, raw_variables

__all__ = ["LOOP_MESSAGE", "double_vjp_projections", "forward_mode_projections"]

#: What the error of forward mode through a ``tf.while_loop`` says (``"auto"`` falls back).
LOOP_MESSAGE = "forward-mode differentiation cannot pass through a loop"


def forward_mode_projections(
    forward_fn: ForwardFn, variables: Sequence[Any], directions: Sequence[tf.Tensor]
) -> RecordedForward:
    """One forward pass under a tape with r forward-mode accumulators active.

    P[:, j] = grad_theta F(theta) . v_j is read from accumulator j (seed,
    Section "Jacobian-vector product"); the same pass is recorded on the tape
    for the clipped backward pass. The accumulators are nested, so the traced
    graph grows quickly with r; use :func:`double_vjp_projections` for r > 2.
    Nested accumulators (r = 2) work only in graph mode (inside ``tf.function``).

    Forward mode cannot pass through Keras's ``tf.while_loop`` RNNs
    ("dtype variant is not compatible"); build them with ``unroll=True`` or use
    the double-vjp path.
    """
    raw = raw_variables(variables)
    r = _num_directions(directions)
    if r > 1 and tf.executing_eagerly():
        raise ValueError(
            f"jvp_method='forward' with jl_projections={r} > 1 nests forward "
            "accumulators, which TensorFlow supports only inside tf.function (graph "
            "mode); run without run_eagerly=True, wrap the call in tf.function, or use "
            "jvp_method='double_vjp'."
        )
    with tf.GradientTape() as tape:
        with contextlib.ExitStack() as stack:
            accumulators = [
                stack.enter_context(
                    tf.autodiff.ForwardAccumulator(raw, [d[j] for d in directions])
                )
                for j in range(r)
            ]
            try:
                forward = forward_fn()
            except (TypeError, ValueError) as err:
                # the two ways TensorFlow's forward mode fails inside a while loop
                if "variant" in str(err) or "without handle data" in str(err):
                    # a plain ValueError: tf.function re-raises it with its type
                    raise ValueError(
                        f"jvp_method='forward' failed: {LOOP_MESSAGE} (a Keras RNN with unroll=False, "
                        "keras.ops.fori_loop / scan, tf.map_fn, tf.while_loop). Build the "
                        "RNN with unroll=True or use jvp_method='double_vjp' (or 'auto')."
                    ) from err
                raise
            check_forward(forward)
            losses = forward.per_example_losses
            projections = tf.stack(
                [acc.jvp(losses, unconnected_gradients=ZERO) for acc in accumulators],
                axis=1,
            )
    return RecordedForward(tape=tape, forward=forward, projections=projections)


def double_vjp_projections(
    recorded: RecordedForward, variables: Sequence[Any], directions: Sequence[tf.Tensor]
) -> tf.Tensor:
    """JL projections by the double-vjp trick on an already recorded forward pass.

    Seed, Section "Jacobian-vector product": with G(u) = u^T grad_theta F (one
    vjp, linear in u), grad_u <G(u), v_j> = grad_theta F . v_j = P[:, j].
    The r second vjps run in a ``tf.while_loop`` (``GradientTape.jacobian``
    without pfor), which traces fast and works through RNN loops. The tape of
    ``recorded`` must be persistent.

    Returns:
      P, shape ``[b, r]``.
    """
    losses = recorded.forward.per_example_losses
    u = tf.ones_like(losses)
    with tf.GradientTape(persistent=True) as outer:  # eager jacobian without pfor needs it
        outer.watch(u)
        vjp = recorded.tape.gradient(
            losses, list(variables), output_gradients=u, unconnected_gradients=ZERO
        )
        inner = [
            tf.linalg.matvec(
                tf.reshape(d, (tf.shape(d)[0], -1)),
                tf.reshape(tf.convert_to_tensor(g), (-1,)),
            )
            for d, g in zip(directions, vjp)
        ]
        targets = tf.add_n(inner)  # [r]: <G(u), v_j>
    # one iteration at a time: running the r second vjps concurrently kept r copies of
    # the backward pass's intermediates alive (peak memory grew with r)
    jac = outer.jacobian(targets, u, unconnected_gradients=ZERO, experimental_use_pfor=False,
                         parallel_iterations=1)
    return tf.transpose(jac)


def _num_directions(directions: Sequence[tf.Tensor]) -> int:
    r = directions[0].shape[0]
    if r is None:
        raise ValueError("the number of JL directions must be known when tracing")
    return int(r)
