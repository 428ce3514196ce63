"""The per-example loss l_1..l_b that differentially private training clips."""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

__all__ = ["PerExampleLoss", "per_example_loss_fn"]

PerExampleLoss = Callable[[Any, Any, Any], tf.Tensor]


def per_example_loss_fn(loss: Any) -> PerExampleLoss:
    """Check ``loss`` gives one value per example; return ``f(y, y_pred, w) -> [b]``.

    Accepted: a ``keras.losses.Loss`` with ``reduction=None`` (or ``"none"``), a
    loss function such as ``keras.losses.sparse_categorical_crossentropy`` or
    its string name. Losses with non-batch axes left (e.g. per time step) are
    averaged over those axes. Sample weights multiply each example's loss.

    Raises:
      ValueError: naming the loss, if it reduces over the batch (DP needs
        l_1..l_b to clip each example), is missing, or is a dict/list.
    """
    if loss is None:
        raise ValueError(
            "loss must be given: a per-example loss such as "
            "keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)"
        )
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            f"loss must be a single per-example loss; got {type(loss).__name__} "
            "(multi-output losses are not supported by PrivateModel)"
        )
    resolved = keras.losses.get(loss) if isinstance(loss, str) else loss
    if isinstance(resolved, keras.losses.Loss):
        if resolved.reduction not in (None, "none"):
            raise ValueError(
                f"loss {_loss_name(loss)} has reduction={resolved.reduction!r}, which "
                "averages over the batch; differentially private training clips each "
                "example's gradient and needs one loss per example. Pass reduction=None, "
                f"e.g. keras.losses.{type(resolved).__name__}(..., reduction=None)."
            )
    elif not callable(resolved):
        raise ValueError(f"loss must be a Keras loss or a callable; got {loss!r}")
    name = _loss_name(loss)

    def compute(y: Any, y_pred: Any, sample_weight: Any = None) -> tf.Tensor:
        if isinstance(resolved, keras.losses.Loss):
            values = resolved(y, y_pred, sample_weight=sample_weight)
            weighted = True
        else:
            values = resolved(y, y_pred)
            weighted = False
        values = tf.convert_to_tensor(values)
        if values.shape.rank == 0:
            raise ValueError(
                f"loss {name} returned a scalar (a loss reduced over the batch); "
                "differentially private training needs one loss per example, shape "
                "[batch]. Use a Keras loss with reduction=None."
            )
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        if sample_weight is not None and not weighted:
            values = values * tf.cast(tf.reshape(sample_weight, (-1,)), values.dtype)
        return values

    return compute


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return repr(loss)
    if isinstance(loss, keras.losses.Loss):
        return f"{type(loss).__name__}(name={loss.name!r})"
    return getattr(loss, "__name__", repr(loss))
