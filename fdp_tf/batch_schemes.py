"""Batches with a fixed epoch structure: random allocation and sampling without replacement.

Two samplings beside Poisson (:mod:`fdp_tf.sampling`) that the accountant certifies
(docs/sampling.md):

* **random allocation** ("balls in bins"): every epoch each example is assigned to one
  of its t steps (or to k distinct ones, ``selected=k``), uniformly and independently, so
  batches are Binomial(N, k/t) in size and every example is used exactly k times per
  epoch (``fdp.RandomAllocation``, add/remove);
* **without replacement**: every step takes exactly B of the N examples, uniformly
  without replacement and independently of the other steps
  (``fdp.SampledWithoutReplacement``, *replace-one*: a replaced example moves the clipped
  sum by up to 2C, so its epsilon is that of the Gaussian at sigma / 2 there).

Both draw from a generator seeded by OS entropy (never a global seed). ``PrivateModel.fit``
recognises the datasets they return, sets the optimizer's expected batch size (B; for
random allocation floor(N k / t), at most the expected N k / t, so the noise std sigma C / B
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
    """Random allocation: each epoch, every example in exactly k of its t steps, the
    k-subset uniform (k = 1: "balls in bins").

    Attributes:
      num_examples: N.
      steps_per_epoch: t in [1, N].
      selected: k in [1, t].

    Raises:
      ValueError: naming the field, for N < 1, t outside [1, N] or k outside [1, t].
    """

    num_examples: int
    steps_per_epoch: int
    selected: int = 1
    scheme: ClassVar[str] = "random_allocation"
    neighboring: ClassVar[str] = "add_remove"

    def __post_init__(self) -> None:
        n = check_integer("num_examples", self.num_examples, low=1)
        t = check_integer("steps_per_epoch", self.steps_per_epoch, low=1, high=n)
        check_integer("selected", self.selected, low=1, high=t)

    @property
    def expected_batch_size(self) -> int:
        """floor(N k / t): at most the expected batch N k / t (the noise std sigma C / B is
        then at least the scheme's)."""
        return self.num_examples * self.selected // self.steps_per_epoch

    @property
    def sampling_rate(self) -> float:
        """k / t: an example's chance to be in a given step (the ledger reads k back from it)."""
        return self.selected / self.steps_per_epoch

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
                              seed: int | None = None, selected: int = 1) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of one epoch of random allocation per pass: t batches, every
    example in exactly k = ``selected`` of them (one by default), the k chosen uniformly,
    fresh at every pass.

    Args:
      x: array or nested structure (tuple / dict) of arrays with N rows.
      y: labels with N rows, or ``None``.
      steps_per_epoch: t in [1, N] (``fdp.dpsgd``'s convention for a batch size B: t =
        ceil(N k / B)).
      sample_weight: optional weights with N rows.
      seed: ``None`` (private): OS entropy, new at every pass. An int makes the batches
        reproducible (tests) and warns :class:`fdp_tf.NotPrivateWarning`.
      selected: k in [1, t], the steps each example is in per pass (k > 1: DP-SGD only).

    Returns:
      The dataset; ``PrivateModel.fit`` books it as :class:`RandomAllocationSampling`
      (whole epochs: a pass cut short is charged as a whole one).

    Raises:
      ValueError: t outside [1, N], k outside [1, t], or inputs with different numbers of rows.
    """
    data = tuple(part for part in (x, y, sample_weight) if part is not None)
    n = _num_rows(data)
    t = check_integer("steps_per_epoch", steps_per_epoch, low=1, high=n)
    k = check_integer("selected", selected, low=1, high=t)
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

    def take(left: tf.Tensor, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # selection sampling (Knuth's algorithm S) for every example at once: step j takes an
        # example with probability (its steps left) / (t - j), so each example is in exactly k
        # steps and its k-subset is uniform; the state is N counters, not an N x t draw
        u = holder.generator.uniform((n,), dtype=tf.float64)
        chosen = u * tf.cast(t - step, tf.float64) < tf.cast(left, tf.float64)
        return left - tf.cast(chosen, tf.int64), tf.where(chosen)[:, 0]

    if k == 1:
        batches = tf.data.Dataset.range(1).flat_map(epoch)
    else:  # a pass starts again from k steps left for every example
        batches = tf.data.Dataset.range(t).scan(tf.fill([n], tf.constant(k, tf.int64)), take)
    # a known length (t) lets Keras count its steps instead of running into the end of a pass
    dataset = (batches.apply(tf.data.experimental.assert_cardinality(t))
               .map(gather).prefetch(tf.data.AUTOTUNE))
    dataset._fdp_generator = holder  # keeps the generator alive with the dataset
    _REGISTRY[dataset] = RandomAllocationSampling(n, t, k)
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
