"""Batches with a fixed epoch structure: random allocation and sampling without replacement.

Two samplings beside Poisson (:mod:`fdp_tf.sampling`) that the accountant certifies
(docs/sampling.md):

* **random allocation** ("balls in bins"): every epoch each example is assigned to one
  of its t steps, uniformly and independently, so batches are Binomial(N, 1/t) in size
  and every example is used exactly once per epoch (``fdp.RandomAllocation``, add/remove);
* **without replacement**: every step takes exactly B of the N examples, uniformly
  without replacement and independently of the other steps
  (``fdp.SampledWithoutReplacement``, *replace-one*: a replaced example moves the clipped
  sum by up to 2C, so its epsilon is that of the Gaussian at sigma / 2 there).

Both draw from a generator seeded by OS entropy (never a global seed). ``PrivateModel.fit``
recognises the datasets they return, sets the optimizer's expected batch size (B; for
random allocation floor(N / t), at most the expected N / t, so the noise std sigma C / B
is never smaller than the scheme's) and books the steps under the scheme.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import tensorflow as tf

from fdp._validation import check_integer
from fdp.epochs import steps_per_epoch as fdp_steps_per_epoch
from fdp_tf.randomness import _Holder, os_entropy_generator, seeded_generator
from fdp_tf.sampling import _REGISTRY, _num_rows

__all__ = ["RandomAllocationSampling", "WithoutReplacementSampling", "random_allocation_batches",
           "without_replacement_batches"]


@dataclass(frozen=True)
class RandomAllocationSampling:
    """Random allocation: each epoch, every example in exactly one of its t steps.

    Attributes:
      num_examples: N.
      steps_per_epoch: t in [1, N].

    Raises:
      ValueError: naming the field, for N < 1 or t outside [1, N].
    """

    num_examples: int
    steps_per_epoch: int
    scheme: ClassVar[str] = "random_allocation"
    neighboring: ClassVar[str] = "add_remove"

    def __post_init__(self) -> None:
        n = check_integer("num_examples", self.num_examples, low=1)
        check_integer("steps_per_epoch", self.steps_per_epoch, low=1, high=n)

    @property
    def expected_batch_size(self) -> int:
        """floor(N / t): at most the expected batch N / t (the noise std sigma C / B is then
        at least the scheme's)."""
        return self.num_examples // self.steps_per_epoch

    @property
    def sampling_rate(self) -> float:
        """1 / t: an example's chance to be in a given step."""
        return 1.0 / self.steps_per_epoch

    @property
    def scheme_size(self) -> int:
        return self.steps_per_epoch


@dataclass(frozen=True)
class WithoutReplacementSampling:
    """Exactly ``batch_size`` of ``num_examples`` examples per step, drawn without
    replacement, independently across steps (epsilon for replacing one example).

    Attributes:
      num_examples: N.
      batch_size: B in [1, N].
      steps_per_epoch: batches per pass (informational; default ceil(N / B)).

    Raises:
      ValueError: naming the field, for N < 1, B outside [1, N] or steps_per_epoch < 1.
    """

    num_examples: int
    batch_size: int
    steps_per_epoch: int | None = None
    scheme: ClassVar[str] = "without_replacement"
    neighboring: ClassVar[str] = "replace_one"

    def __post_init__(self) -> None:
        n = check_integer("num_examples", self.num_examples, low=1)
        check_integer("batch_size", self.batch_size, low=1, high=n)
        if self.steps_per_epoch is not None:
            check_integer("steps_per_epoch", self.steps_per_epoch, low=1)

    @property
    def expected_batch_size(self) -> int:
        return self.batch_size

    @property
    def sampling_rate(self) -> float:
        """B / N."""
        return self.batch_size / self.num_examples

    @property
    def scheme_size(self) -> int:
        return self.num_examples


def random_allocation_batches(x: Any, y: Any = None, *, steps_per_epoch: int, sample_weight: Any = None,
                              seed: int | None = None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of one epoch of random allocation per pass: t batches, every
    example in exactly one of them, chosen uniformly, fresh at every pass.

    Args:
      x: array or nested structure (tuple / dict) of arrays with N rows.
      y: labels with N rows, or ``None``.
      steps_per_epoch: t in [1, N] (``fdp.dpsgd``'s convention for a batch size B: t = ceil(N / B)).
      sample_weight: optional weights with N rows.
      seed: ``None`` (private): OS entropy, new at every pass. An int makes the batches
        reproducible (tests) and warns :class:`fdp_tf.NotPrivateWarning`.

    Returns:
      The dataset; ``PrivateModel.fit`` books it as :class:`RandomAllocationSampling`
      (whole epochs: a pass cut short is charged as a whole one).

    Raises:
      ValueError: t outside [1, N], or inputs with different numbers of rows.
    """
    data = tuple(part for part in (x, y, sample_weight) if part is not None)
    n = _num_rows(data)
    t = check_integer("steps_per_epoch", steps_per_epoch, low=1, high=n)
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    holder = _Holder(os_entropy_generator() if seed is None else seeded_generator(seed))

    def epoch(_: tf.Tensor) -> tf.data.Dataset:
        # the whole pass's allocation in one draw: nothing is shared between passes
        step = tf.cast(tf.floor(holder.generator.uniform((n,), dtype=tf.float64) * t), tf.int64)
        step = tf.minimum(step, t - 1)  # u < 1, but guard the float product
        order = tf.argsort(step, stable=True)
        counts = tf.math.bincount(step, minlength=t, maxlength=t, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(order, counts))

    def gather(index: tf.Tensor) -> Any:
        picked = tf.nest.map_structure(lambda a: tf.gather(a, index), tensors)
        return picked if len(picked) > 1 else picked[0]

    # a known length (t) lets Keras count its steps instead of running into the end of a pass
    dataset = (tf.data.Dataset.range(1).flat_map(epoch).apply(tf.data.experimental.assert_cardinality(t))
               .map(gather).prefetch(tf.data.AUTOTUNE))
    dataset._fdp_generator = holder  # keeps the generator alive with the dataset
    _REGISTRY[dataset] = RandomAllocationSampling(n, t)
    return dataset


def without_replacement_batches(x: Any, y: Any = None, *, batch_size: int, sample_weight: Any = None,
                                steps_per_epoch: int | None = None, seed: int | None = None) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of batches of exactly B examples drawn without replacement,
    independently at every step (epsilon for *replacing* one example; docs/sampling.md).

    Args:
      x: array or nested structure (tuple / dict) of arrays with N rows.
      y: labels with N rows, or ``None``.
      batch_size: B in [1, N].
      sample_weight: optional weights with N rows.
      steps_per_epoch: batches per pass; default ceil(N / B).
      seed: ``None`` (private): OS entropy. An int makes the batches reproducible (tests)
        and warns :class:`fdp_tf.NotPrivateWarning`.

    Returns:
      The dataset; ``PrivateModel.fit`` books it as :class:`WithoutReplacementSampling`.

    Raises:
      ValueError: B outside [1, N], steps_per_epoch < 1, or inputs with different numbers of rows.
    """
    data = tuple(part for part in (x, y, sample_weight) if part is not None)
    n = _num_rows(data)
    b = check_integer("batch_size", batch_size, low=1, high=n)
    steps = fdp_steps_per_epoch(b, n) if steps_per_epoch is None else check_integer(
        "steps_per_epoch", steps_per_epoch, low=1)
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    holder = _Holder(os_entropy_generator() if seed is None else seeded_generator(seed))

    def select(_: tf.Tensor) -> Any:
        # the B largest of N iid uniform keys: a uniform B-subset
        _, index = tf.math.top_k(holder.generator.uniform((n,), dtype=tf.float64), k=b, sorted=False)
        picked = tf.nest.map_structure(lambda a: tf.gather(a, index), tensors)
        return picked if len(picked) > 1 else picked[0]

    dataset = tf.data.Dataset.range(steps).map(select, num_parallel_calls=None).prefetch(tf.data.AUTOTUNE)
    dataset._fdp_generator = holder
    _REGISTRY[dataset] = WithoutReplacementSampling(n, b, steps)
    return dataset
