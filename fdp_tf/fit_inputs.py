"""How ``PrivateModel.fit``'s input is sampled; arrays are drawn as Poisson batches.

The accountant certifies Poisson sampling (each example joins each batch with
probability p = B / N). With a DP optimizer, ``fit`` books its steps at a rate only
when it can vouch for it:

* a :func:`fdp_tf.poisson_batches` dataset, or any input with
  ``sampling=fdp_tf.PoissonSampling(...)`` (you vouch): p = B / N;
* a :func:`fdp_tf.random_allocation_batches` or :func:`fdp_tf.without_replacement_batches`
  dataset, or any input with ``sampling=fdp_tf.RandomAllocationSampling(...)`` /
  ``fdp_tf.WithoutReplacementSampling(...)`` (you vouch: for random allocation, each
  pass over the input is one epoch of t batches): booked under that scheme;
* arrays, ``fit(x, y, batch_size=B)``: drawn through :func:`fdp_tf.poisson_batches`
  (Keras's shuffled fixed-size batches are another mechanism), so ordinary Keras code
  gets a certified epsilon. Keras's array options keep their meaning:
  ``validation_split`` holds out the last fraction of the rows, as Keras does, and
  p = B / N_train; ``sample_weight`` and ``class_weight`` become per-example weights
  drawn with their rows (both at once are refused, as Keras refuses them);
  ``steps_per_epoch`` is the number of batches per epoch (default ceil(N_train / B));
  ``shuffle=False`` keeps Keras's fixed batches in order, which no sampling amplifies:
  booked at rate 1, with a :class:`fdp_tf.SamplingWarning`;
* anything else (a mapped dataset, a generator): refused, saying how to pass ``sampling``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from fdp._validation import check_real
from fdp_tf.batch_schemes import RandomAllocationSampling, WithoutReplacementSampling
from fdp_tf.sampling import (PoissonSampling, SamplingWarning, _array_rows, poisson_batches, poisson_sampling_of,
                             sampling_of)

__all__ = ["SAMPLINGS", "FitPlan", "plan_fit"]

#: The samplings ``fit`` and ``open_segment`` book.
SAMPLINGS = (PoissonSampling, RandomAllocationSampling, WithoutReplacementSampling)

_KERAS_DEFAULT_BATCH = 32


@dataclass(frozen=True)
class FitPlan:
    """What ``fit`` passes to Keras, and how its steps are booked.

    Attributes:
      x, y, batch_size, kwargs: the arguments for ``keras.Model.fit``.
      sampling: the sampling fit vouches for (one of :data:`SAMPLINGS`); ``None``: rate 1
        (no amplification).
      expected_batch_size: B for the optimizer (``None`` for a non-private optimizer).
    """

    x: Any
    y: Any
    batch_size: int | None
    kwargs: dict[str, Any]
    sampling: Any
    expected_batch_size: int | None


def plan_fit(x: Any, y: Any, batch_size: int | None, kwargs: dict[str, Any],
             sampling: Any, private: bool) -> FitPlan:
    """The :class:`FitPlan` of ``fit(x, y, batch_size, **kwargs, sampling=...)``.

    Raises:
      ValueError: for a DP optimizer, when the sampling cannot be known (a dataset or
        generator without ``sampling=``), and for array options that cannot be kept.
    """
    if not private:
        return FitPlan(x, y, batch_size, kwargs, None, None)
    if sampling is not None:
        if not isinstance(sampling, SAMPLINGS):
            raise ValueError("sampling must be an fdp_tf.PoissonSampling, RandomAllocationSampling or "
                             f"WithoutReplacementSampling; got {type(sampling).__name__}")
        drawn = sampling_of(x)
        if drawn is not None and drawn != sampling:  # red team: the registry was overridden silently
            raise ValueError(f"x was drawn by fdp_tf's sampler as {drawn}; sampling={sampling} contradicts "
                             "it: leave sampling out, fit reads it from the dataset")
        if _array_rows(x) is not None:  # Keras would cut them into fixed batches
            raise ValueError(
                "sampling= is for a dataset or generator you draw yourself; fit draws arrays as "
                "Poisson batches itself: pass fit(x, y, batch_size=B) without sampling="
            )
        return FitPlan(x, y, batch_size, kwargs, sampling, sampling.expected_batch_size)
    spec = sampling_of(x)
    if spec is not None:
        return FitPlan(x, y, batch_size, kwargs, spec, spec.expected_batch_size)
    if _array_rows(x) is None:
        raise ValueError(
            "fit cannot know how this input is sampled, so neither the expected batch "
            "size B (the noise std is sigma*C/B) nor the sampling rate can be known. "
            "Train on arrays or fdp_tf.poisson_batches(x, y, expected_batch_size=B), or pass "
            "fit(..., sampling=fdp_tf.PoissonSampling(num_examples=N, "
            "expected_batch_size=B)) for a Poisson-sampled pipeline of your own. A dataset "
            "mapped from one of fdp_tf's samplers (poisson_batches(...).map(f)) keeps its "
            "sampling: fit(mapped, sampling=fdp_tf.sampling_of(original))"
        )
    return _plan_arrays(x, y, batch_size, dict(kwargs))


def _plan_arrays(x: Any, y: Any, batch_size: int | None, kwargs: dict[str, Any]) -> FitPlan:
    x = tuple(x) if isinstance(x, list) else x  # tf.data would stack a list of inputs
    weights = kwargs.pop("sample_weight", None)
    class_weight = kwargs.pop("class_weight", None)
    if class_weight is not None:
        if weights is not None:
            raise ValueError(
                "class_weight and sample_weight cannot be given together (Keras refuses them "
                "too): multiply the class weights into sample_weight"
            )
        weights = _class_weights(y, class_weight)
    if weights is not None and y is None:
        raise ValueError("sample_weight and class_weight need labels y")
    data = (x, y, weights)
    split = check_real("validation_split", kwargs.pop("validation_split", 0.0) or 0.0,
                       low=0.0, high=1.0, high_inclusive=False)
    if split and kwargs.get("validation_data") is None:  # as in Keras, validation_data wins
        data, held = _split(data, split)
        kwargs["validation_data"] = tuple(part for part in held if part is not None)
    rows = _array_rows(data[0])
    batch = min(batch_size or _KERAS_DEFAULT_BATCH, rows)
    if not kwargs.pop("shuffle", True):
        warnings.warn(
            "fit(..., shuffle=False) trains on Keras's fixed batches in order, which no sampling "
            "amplifies: its steps are booked at sampling rate 1. Leave shuffle at its default "
            "for Poisson batches (certified amplification by sampling).",
            SamplingWarning, stacklevel=4,
        )
        return FitPlan(data[0], data[1], batch, dict(kwargs, shuffle=False, sample_weight=data[2]),
                       None, batch)
    dataset = poisson_batches(data[0], data[1], expected_batch_size=batch, sample_weight=data[2],
                              steps_per_epoch=kwargs.pop("steps_per_epoch", None))
    return FitPlan(dataset, None, None, kwargs, poisson_sampling_of(dataset), batch)


def _split(data: tuple[Any, ...], split: float) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Keras's validation split: the last ``split`` fraction of the rows, not shuffled."""
    rows = _array_rows(data[0])
    keep = int(math.floor(rows * (1.0 - split)))
    if keep in (0, rows):
        raise ValueError(
            f"validation_split={split} leaves {keep} of {rows} rows for training; choose a "
            "split that leaves rows on both sides"
        )

    def cut(part: Any, rows_slice: slice) -> Any:
        return None if part is None else tf.nest.map_structure(lambda a: a[rows_slice], part)

    return (tuple(cut(p, slice(None, keep)) for p in data),
            tuple(cut(p, slice(keep, None)) for p in data))


def _class_weights(y: Any, class_weight: dict[int, float]) -> np.ndarray:
    """Keras's rule: the weight of each row's class (argmax of one-hot labels)."""
    if y is None or len(tf.nest.flatten(y)) != 1:
        raise ValueError("class_weight needs one array of labels y (a single-output model)")
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else np.squeeze(labels, axis=-1)
    labels = np.round(labels).astype("int64")
    return np.array([class_weight.get(int(c), 1.0) for c in labels], dtype="float32")
