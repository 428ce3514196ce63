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
        for attr in ("layers", "layer", "forward_layer", "backward_layer"):
            child = getattr(current, attr, None)
            if isinstance(child, keras.layers.Layer):
                stack.append(child)
            elif isinstance(child, (list, tuple)):
                stack.extend(c for c in child if isinstance(c, keras.layers.Layer))


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
