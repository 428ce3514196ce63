"""Which per-example method a DP optimizer's ``"auto"`` picks for a model.

:meth:`fdp_tf.DPSGDJL.resolve_jvp_method` and
:meth:`fdp_tf.DPSGDVanilla.resolve_per_example_method` call these; the methods themselves
are in :mod:`fdp_tf.jl`, :mod:`fdp_tf.layerwise`, :mod:`fdp_tf.recurrent_tangents` and
:mod:`fdp_tf.per_example`, and :mod:`fdp_tf.verify` checks the choice on the first step.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Sequence

import tensorflow as tf

from fdp_tf.config import MAX_NESTED_FORWARD_PROJECTIONS
from fdp_tf.introspection import looped_rnn_layers
from fdp_tf.layerwise import layerwise_unsupported
from fdp_tf.randomness import num_replicas
from fdp_tf.recurrent_tangents import tangent_unsupported
from fdp_tf.second_order import without_second_order

__all__ = ["resolve_jvp_method", "resolve_per_example_method"]


def resolve_jvp_method(method: str, jl_projections: int, model: Any = None) -> str:
    """What ``jvp_method=method`` runs for ``model`` with ``jl_projections`` directions.

    ``"auto"``: forward mode (``"auto"``: with the double vjp should the trace meet a loop) when
    r = 1 and the model has no looped Keras RNN: one forward pass with one tangent,
    the cheapest (1.9x a non-private step on the MNIST CNN, against 3.2x for the
    taps). Otherwise ``"layerwise"`` when every trainable variable belongs to a
    layer the taps handle (Dense, Conv1D/2D, Embedding, LSTM, GRU, SimpleRNN, also
    inside Bidirectional): one forward and one backward pass for any r, through
    Keras's RNN loops too. Otherwise, when every loop is a plain Keras LSTM, GRU or
    SimpleRNN, forward mode with the r tangents carried together through the loops and
    a second, taped pass for the clipped sum (:mod:`fdp_tf.recurrent_tangents`;
    ``jvp_method="forward"`` asks for it on any such model: for r = 1 the least memory,
    about non-DP's, and slower than the taps; for r > 1 much slower than the taps).
    Otherwise forward mode for r = 2 inside ``tf.function`` (nested accumulators fail
    eagerly) when no looped RNN is in the way, else the double-vjp trick, about one extra
    backward pass per direction; a looped RNN on that route warns once, naming the layer.
    Where TensorFlow cannot differentiate the model's backward pass
    (:mod:`fdp_tf.second_order`): the per-example loop.

    Raises:
      ValueError: for ``"forward"`` with r > 2 on a model whose loops cannot carry the
        r tangents together, and for ``"forward"`` / ``"double_vjp"`` where TensorFlow
        cannot differentiate the backward pass.
    """
    missing = without_second_order(model)
    if missing is not None:  # fdp_tf.second_order: nothing differentiates the backward pass
        if method in ("forward", "double_vjp"):
            raise ValueError(
                f"jvp_method={method!r} differentiates the backward pass, and TensorFlow defines no "
                f"gradient of the op {missing!r} in this model's: use jvp_method='auto' (then the "
                "per-example loop), 'loop' or 'layerwise'")
        if method == "auto":
            # the loop, not the taps: where the taps meet a weight used outside its layer they
            # need a second pass (other dropout masks than the first) or the double vjp
            return "loop"
    if method == "forward" and jl_projections > MAX_NESTED_FORWARD_PROJECTIONS:
        reason = "no model given" if model is None else tangent_unsupported(model)
        if reason is not None:
            raise ValueError(
                f"jvp_method='forward' with jl_projections={jl_projections} > "
                f"{MAX_NESTED_FORWARD_PROJECTIONS} needs a model whose recurrent loops carry the r tangents "
                f"together ({reason}); elsewhere forward mode nests one accumulator per direction, which "
                "grows the graph exponentially. Use jvp_method='layerwise', 'double_vjp' or 'auto'.")
    if method != "auto":
        return method
    looped = looped_rnn_layers(model) if model is not None else []
    if jl_projections == 1 and not looped:
        return "auto"  # forward mode, or the double vjp if the trace meets another loop
    if model is not None and layerwise_unsupported(model) is None:
        return "layerwise"
    if looped and tangent_unsupported(model) is None:
        return "auto"  # forward mode carried through the loops, then a taped pass
    if looped:
        _warn_double_vjp(model, looped)
        return "double_vjp"
    if jl_projections > MAX_NESTED_FORWARD_PROJECTIONS or tf.executing_eagerly():
        return "double_vjp"
    return "auto"


def resolve_per_example_method(method: str, model: Any = None) -> str:
    """What ``per_example_method=method`` runs for ``model``.

    ``"auto"``: ``"layerwise"`` when every trainable variable belongs to a layer it handles
    (Dense, Embedding, Conv1D, Conv2D, LSTM / GRU / SimpleRNN without internal dropout, also
    inside Bidirectional): exact norms from activations and backpropagated
    gradients, then one reweighted backward pass, with no per-example gradient of
    the whole model in memory. Otherwise ``"vectorized"`` (pfor) unless the model
    has a looped RNN (then ``"loop"``, because vectorising a ``tf.while_loop``
    traces for tens of seconds, and under ``tf.distribute`` with several replicas,
    where a crash of pfor on the first step could not be retried).
    """
    if method != "auto":
        return method
    if model is not None and layerwise_unsupported(model) is None:
        return "layerwise"
    if model is not None and looped_rnn_layers(model):
        return "loop"
    if num_replicas() > 1:
        # pfor may crash inside TensorFlow on a first step (Conv3D with groups), and
        # under several replicas an aborted collective cannot be retried in-process
        return "loop"
    return "vectorized"


_WARNED_DOUBLE_VJP: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _warn_double_vjp(model: Any, looped: Sequence[Any]) -> None:
    """Warn once per model that its loop forces the double vjp, naming why."""
    if model in _WARNED_DOUBLE_VJP:
        return
    _WARNED_DOUBLE_VJP.add(model)
    names = ", ".join(repr(layer.name) for layer in looped)
    warnings.warn(
        f"DP-SGD-JL: the model's loop ({names}) runs under a layer the layer taps do not "
        f"handle ({layerwise_unsupported(model)}), so the JL projections use the double vjp "
        "(about one backward pass per direction). Models built from Dense, Conv1D/2D, "
        "Embedding, LSTM, GRU and SimpleRNN layers get one pass for any number of directions.",
        RuntimeWarning, stacklevel=5,
    )
