"""Find what in a Keras model decides the differentiation strategy.

Only public attributes are used: ``Model.layers``, ``Wrapper.layer``,
``Bidirectional.forward_layer`` / ``backward_layer`` and ``RNN.unroll``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import keras
import tensorflow as tf

__all__ = ["iter_layers", "looped_rnn_layers", "seed_states"]


def iter_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Depth-first walk over a layer and its public sub-layers."""
    seen: set[int] = set()
    stack = [layer]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend(_children(current))


def _children(layer: Any) -> list[keras.layers.Layer]:
    """The public sub-layers of ``layer`` (a model's, a wrapper's)."""
    out: list[keras.layers.Layer] = []
    for attr in ("layers", "layer", "forward_layer", "backward_layer"):
        child = getattr(layer, attr, None)
        if isinstance(child, keras.layers.Layer):
            out.append(child)
        elif isinstance(child, (list, tuple)):
            out.extend(c for c in child if isinstance(c, keras.layers.Layer))
    return out


def looped_rnn_layers(model: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Keras RNN layers that run a ``tf.while_loop`` (``unroll=False``).

    Forward-mode autodiff fails through these ("dtype variant is not
    compatible"), so the JL optimizers switch to the double-vjp path.
    """
    return [
        layer
        for layer in iter_layers(model)
        if isinstance(layer, keras.layers.RNN) and not getattr(layer, "unroll", False)
    ]


def seed_states(model: Any) -> list[Any]:
    """The state of every Keras ``SeedGenerator`` of ``model``: its variables that are not
    weights (``Layer.variables`` includes seed states, ``Layer.weights`` does not).
    Assigning them their earlier values makes the next pass draw the same dropout masks."""
    if model is None:
        return []
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights and "int" in str(v.dtype)]


def seed_rewind(model: Any) -> Callable[[], None]:
    """A rewind to ``model``'s seed states as they are now: after it, the next training pass
    draws the random numbers (dropout masks) the first pass from now draws.

    A step whose released pass is not its first (the layer taps record a fresh pass where
    they cannot be used, or where they missed a use of a weight) rewinds before it, so the
    release is computed under the masks of the step's first pass whichever route runs: the
    discarded pass released nothing, and every route draws alike (the privacy fuzzer's
    reference, a fresh model's first pass, holds for each)."""
    states = seed_states(model)
    start = [tf.identity(tf.convert_to_tensor(s)) for s in states]

    def rewind() -> None:
        for state, value in zip(states, start):
            state.assign(value)

    return rewind


#: Keras's own layers whose ``call`` never writes a weight (by exact type: a subclass may).
#: ``BatchNormalization`` is refused before any step (:mod:`fdp_tf.guards`).
_WRITE_FREE = tuple(getattr(keras.layers, name) for name in (
    "Dense", "EinsumDense", "Embedding", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D",
    "LayerNormalization", "GroupNormalization", "UnitNormalization", "MultiHeadAttention", "LSTM", "GRU",
    "SimpleRNN", "LSTMCell", "GRUCell", "SimpleRNNCell", "PReLU", "Bidirectional", "TimeDistributed",
    "InputLayer", "Dropout", "Flatten", "Reshape", "Activation",
) if hasattr(keras.layers, name))


def writable_weights(model: Any) -> list[Any]:
    """The weights of ``model`` a training step's passes may write (those not trainable are
    what a step must leave as it found them): every one but those of Keras's own layers
    that never write one (a frozen ``Dense`` kernel, a frozen backbone's) and of its
    ``Sequential`` and functional models (which own none). A user's layer may write (a
    running statistic); so may a layer of a type not listed here. What a step that aborts
    outside its checks leaves written there is put back by
    :func:`fdp_tf.fallback.guarded_train_function`."""
    if model is None:
        return []
    write_free = {id(w) for layer in iter_layers(model) if _write_free(layer) for w in _own_weights(layer)}
    return [w for w in model.weights if id(w) not in write_free]


def _write_free(layer: Any) -> bool:
    if type(layer) in _WRITE_FREE:
        return True
    # Keras's own model classes (Sequential, Functional): their weights are their layers'
    return isinstance(layer, keras.Model) and type(layer).__module__.startswith("keras.src.models.")


def _own_weights(layer: Any) -> list[Any]:
    """``layer``'s weights less those of the sub-layers :func:`iter_layers` walks into (a
    wrapper's are its inner layer's, judged there)."""
    inner = {id(w) for child in _children(layer) for w in child.weights}
    return [w for w in layer.weights if id(w) not in inner]
