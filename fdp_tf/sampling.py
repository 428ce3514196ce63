"""Poisson-sampled batches: the sampling the privacy accountant assumes.

The accountant (``fdp.PLDAccountant``, and the seed's Theorem
"final privacy curve") analyses each step with *Poisson* subsampling at rate
p = B / N: every example joins the batch independently with probability p, so
the batch size is Binomial(N, p) with mean B. Shuffled fixed-size batches (what
Keras's ``fit(x, y, batch_size=B)`` cuts) are a different mechanism; accounting
them as Poisson is common practice but not what the bound certifies, so
``PrivateModel.fit`` draws arrays through :func:`poisson_batches` instead.

:func:`poisson_batches` builds a ``tf.data`` pipeline with exactly that sampling;
:class:`fdp_tf.PrivateModel` recognises it, sets the optimizer's
``expected_batch_size`` to B (the noise scale sigma*C/B and the averaging use the
expected, never the realised size) and records p for
:class:`fdp_tf.PrivacyCallback`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from fdp._validation import check_integer
from fdp.epochs import steps_per_epoch as fdp_steps_per_epoch
from fdp_tf.randomness import _Holder, os_entropy_generator, seeded_generator

__all__ = [
    "PoissonSampling",
    "SamplingWarning",
    "pad_to_replicas",
    "poisson_batches",
    "poisson_sampling_of",
    "sampling_of",
]


class SamplingWarning(UserWarning):
    """Training steps whose batches fdp_tf cannot vouch for are booked at sampling rate 1
    (no amplification); the warning says how to draw them so that they are amplified."""


@dataclass(frozen=True)
class PoissonSampling:
    """Parameters of a Poisson-sampled pipeline.

    Attributes:
      num_examples: N.
      expected_batch_size: B, 1 <= B <= N.
      steps_per_epoch: batches drawn per pass over the dataset (informational).

    Raises:
      ValueError: naming the field, for N < 1 or B outside [1, N].
    """

    num_examples: int
    expected_batch_size: int
    steps_per_epoch: int | None = None
    #: The ledger's name of the scheme, its size field, and the relation of its epsilon.
    scheme: ClassVar[str] = "poisson"
    scheme_size: ClassVar[int] = 0
    neighboring: ClassVar[str] = "add_remove"

    def __post_init__(self) -> None:
        n = check_integer("num_examples", self.num_examples, low=1)
        check_integer("expected_batch_size", self.expected_batch_size, low=1, high=n)
        if self.steps_per_epoch is not None:
            check_integer("steps_per_epoch", self.steps_per_epoch, low=1)

    @property
    def sampling_rate(self) -> float:
        """p = B / N."""
        return self.expected_batch_size / self.num_examples


# the sampling of every dataset fdp_tf's samplers made (poisson_batches and those of
# fdp_tf.batch_schemes), by the dataset object itself
_REGISTRY: "weakref.WeakKeyDictionary[tf.data.Dataset, Any]" = weakref.WeakKeyDictionary()


def sampling_of(dataset: Any) -> Any:
    """The sampling of a dataset made by one of fdp_tf's samplers (:func:`poisson_batches`,
    :func:`fdp_tf.random_allocation_batches`, :func:`fdp_tf.without_replacement_batches`),
    else None. Only the dataset object a sampler returned is recognised; a dataset
    derived from it by ``.map`` etc. is a new object."""
    if not isinstance(dataset, tf.data.Dataset):
        return None
    return _REGISTRY.get(dataset)


def poisson_sampling_of(dataset: Any) -> PoissonSampling | None:
    """The :class:`PoissonSampling` of a dataset made by :func:`poisson_batches`, else None."""
    spec = sampling_of(dataset)
    return spec if isinstance(spec, PoissonSampling) else None


def poisson_batches(
    x: Any,
    y: Any = None,
    *,
    expected_batch_size: int,
    sample_weight: Any = None,
    steps_per_epoch: int | None = None,
    seed: int | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of Poisson-sampled batches of (x, y[, sample_weight]).

    Each batch takes every example independently with probability
    p = expected_batch_size / N, so batch sizes vary (Binomial(N, p)) and may
    be zero. Iterating the dataset again (a new epoch) draws new batches.

    Args:
      x: array or nested structure (tuple / dict) of arrays with N rows.
      y: labels with N rows, or ``None``.
      expected_batch_size: B, 1 <= B <= N.
      sample_weight: optional weights with N rows.
      steps_per_epoch: batches per epoch; default ceil(N / B) (one expected
        pass over the data).
      seed: ``None`` (private): every batch is drawn from a generator seeded by OS
        entropy, independent of every global seed, and new at every epoch. An int
        makes the batches reproducible (tests) and warns
        :class:`fdp_tf.NotPrivateWarning`.

    Returns:
      The dataset; ``PrivateModel.fit`` reads its :class:`PoissonSampling` (also
      returned by :func:`poisson_sampling_of`).

    Raises:
      ValueError: expected_batch_size outside [1, N], steps_per_epoch < 1, or
        inputs with different numbers of rows.
    """
    data = tuple(part for part in (x, y, sample_weight) if part is not None)
    n = _num_rows(data)
    batch = check_integer("expected_batch_size", expected_batch_size, low=1, high=n)
    if steps_per_epoch is None:
        steps = fdp_steps_per_epoch(batch, n)  # fdp.epochs: the one convention
    else:
        steps = check_integer("steps_per_epoch", steps_per_epoch, low=1)
    rate = batch / n
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    holder = _Holder(os_entropy_generator() if seed is None else seeded_generator(seed))

    def select(_: tf.Tensor) -> Any:
        # the generator advances at every batch and every epoch; never a global seed
        keep = holder.generator.uniform((n,), dtype=tf.float64) < rate
        index = tf.where(keep)[:, 0]
        picked = tf.nest.map_structure(lambda t: tf.gather(t, index), tensors)
        return picked if len(picked) > 1 else picked[0]

    # one batch at a time, in order: the generator's draws must not race
    dataset = tf.data.Dataset.range(steps).map(select, num_parallel_calls=None).prefetch(tf.data.AUTOTUNE)
    dataset._fdp_generator = holder  # keeps the generator alive with the dataset
    _REGISTRY[dataset] = PoissonSampling(n, batch, steps)
    return dataset


def _num_rows(data: tuple[Any, ...]) -> int:
    if not data:
        raise ValueError("x must be given; got None")
    sizes = {int(np.shape(leaf)[0]) for part in data for leaf in tf.nest.flatten(part)}
    if len(sizes) != 1:
        raise ValueError(
            f"x, y and sample_weight must have the same number of rows; got {sorted(sizes)}"
        )
    (n,) = sizes
    if n < 1:
        raise ValueError("x must have at least one row; got 0")
    return n


def _array_rows(x: Any) -> int | None:
    """Number of rows of array-like ``x`` (or a nest of arrays); None for datasets etc."""
    if x is None or isinstance(x, tf.data.Dataset):
        return None
    leaves = tf.nest.flatten(x)
    try:
        return int(leaves[0].shape[0]) if leaves and hasattr(leaves[0], "shape") else None
    except (TypeError, IndexError):
        return None


def pad_to_replicas(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """Pad every batch with zero rows of sample weight 0 to a multiple of ``replicas``.

    Keras splits a global batch between replicas and, for its first batch, averages
    the replicas' parts, which fails when they differ in size. A padded row has loss
    0 * l = 0: its gradient is 0, it changes no clipped sum, and the expected batch
    size B (the noise scale) is that of the real rows.
    """

    def pad(*element: Any) -> Any:
        x = element[0]
        y = element[1] if len(element) > 1 else None
        first = tf.nest.flatten(x)[0]
        b = tf.shape(first)[0]
        w = element[2] if len(element) > 2 else tf.ones([b], tf.float32)
        extra = (-b) % replicas

        def grow(t: tf.Tensor) -> tf.Tensor:
            paddings = tf.concat([[[0, extra]], tf.zeros([tf.rank(t) - 1, 2], tf.int32)], 0)
            grown = tf.pad(t, paddings)
            # paddings of a dynamic rank lose every static dimension; layers that build from
            # the inner ones (DepthwiseConv2D) then fail (the privacy fuzzer, seed 4275269902)
            grown.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            return grown

        x = tf.nest.map_structure(grow, x)
        y = None if y is None else tf.nest.map_structure(grow, y)
        return x, y, grow(tf.cast(w, tf.float32))

    return dataset.map(pad)
