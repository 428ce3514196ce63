"""Randomness of a private step: drawn from OS entropy, never from a global seed.

The noise of DP-SGD and the JL directions must be unpredictable: anyone who can
reproduce the noise can subtract it. ``keras.utils.set_random_seed`` (which
examples and test suites call) fixes Keras's, TensorFlow's, NumPy's and Python's
generators, so none of them is used here. Instead:

* a :class:`tf.random.Generator` (Philox) whose whole 192-bit state (a 128-bit
  counter and a 64-bit key) comes from ``os.urandom``;
* per private step, one 128-bit key ``k = generator.make_seeds(1)`` (the generator
  advances, so every step gets a fresh key);
* every draw of that step is ``stateless_normal(shape, seed=fold_in(fold_in(k, replica), draw))``
  with ``draw`` distinct for each variable and for the noise and the directions, and
  ``replica`` the replica's id under ``tf.distribute``: draws are independent across
  variables, directions, steps and replicas, whatever the generator's placement —
  except a DP optimizer's JL directions, which all replicas share (a key from a secret
  of the optimizer and the step's index, read alike everywhere, with no collective):
  one projection for the whole global batch, as on one device.

An explicit integer ``seed`` (tests) makes the run reproducible and therefore *not*
private; it warns with :class:`NotPrivateWarning`.
"""

from __future__ import annotations

import secrets
import warnings
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "NotPrivateWarning",
    "StepRandomness",
    "add_gaussian_noise",
    "noise_scale",
    "num_replicas",
    "os_entropy_generator",
    "resolve_generator",
    "secret_key",
    "seeded_generator",
    "step_randomness",
]


# draw streams within a step: JL directions, noise and the layer-wise coverage check
# never share a key
DIRECTIONS_STREAM = 0
NOISE_STREAM = 1
CHECK_STREAM = 2


class NotPrivateWarning(UserWarning):
    """The noise is reproducible (an explicit seed was given): the run is not private."""


class _Holder:
    """Keeps a generator out of TensorFlow's object tracking, so that no checkpoint or
    saved model ever contains its state (which would predict all later noise)."""

    def __init__(self, generator: tf.random.Generator) -> None:
        self.generator = generator


def os_entropy_generator() -> tf.random.Generator:
    """A Philox generator whose 192-bit state is read from ``os.urandom``."""
    state = np.frombuffer(secrets.token_bytes(24), dtype=np.int64).copy()
    with tf.init_scope():  # may be called while a tf.function traces
        return tf.random.Generator(state=state, alg="philox")


def seeded_generator(seed: int, *, stacklevel: int = 3) -> tf.random.Generator:
    """A generator from an explicit seed, for tests; warns that the run is not private."""
    warnings.warn(
        f"seed={seed!r} makes the DP noise and JL directions reproducible, so the training "
        "is NOT differentially private (anyone with the seed can remove the noise). Use "
        "seed=None outside tests.",
        NotPrivateWarning,
        stacklevel=stacklevel,
    )
    with tf.init_scope():
        return tf.random.Generator.from_seed(int(seed), alg="philox")


_DEFAULT: list[_Holder] = []


def resolve_generator(rng: Any) -> tf.random.Generator:
    """``rng`` itself, or for ``None`` a process-wide generator seeded from OS entropy.

    Raises:
      ValueError: for an int or anything else: an int would repeat the same noise
        at every call (pass a ``tf.random.Generator``, which advances).
    """
    if rng is None:
        if not _DEFAULT:
            _DEFAULT.append(_Holder(os_entropy_generator()))
        return _DEFAULT[0].generator
    if isinstance(rng, tf.random.Generator):
        return rng
    raise ValueError(
        f"rng must be a tf.random.Generator or None (OS entropy); got {rng!r}. An integer "
        "seed would give the same noise at every call; for a reproducible test pass "
        "tf.random.Generator.from_seed(seed), which advances between calls."
    )


class StepRandomness:
    """The random draws of one private step, all keyed by one fresh 128-bit key.

    Args:
      generator: advanced once, here (one key per step).
      shared: under ``tf.distribute``, (a secret key from OS entropy, the step's index)
        read alike on every replica: the JL directions' key, the same on all replicas.
    """

    def __init__(self, generator: tf.random.Generator, shared: tuple[Any, Any] | None = None) -> None:
        key = generator.make_seeds(1)[:, 0]
        self._shared = key
        replica = _replica_id()
        if replica is not None:
            if shared is not None:  # the directions: one key on every replica (see normal)
                base, step = shared
                self._shared = tf.random.experimental.stateless_fold_in(
                    tf.convert_to_tensor(base), tf.cast(tf.convert_to_tensor(step), tf.int64))
            key = tf.random.experimental.stateless_fold_in(key, replica)
        self._key = key
        self._draws = 0

    def normal(self, shape: Sequence[int], dtype: Any, stream: int) -> tf.Tensor:
        """A standard normal tensor, independent of every other draw of the step.

        The JL directions (``DIRECTIONS_STREAM``) are the same on every replica under
        ``tf.distribute`` when ``shared`` was given (a DP optimizer gives it): every
        example of the global batch is projected on the same directions, as on one device. Directions per replica would tie an example's
        clipping factor to the replica its position puts it on, and removing one example
        moves others across replicas, changing their clipped terms (the fuzzer measured
        0.28 C). The noise and other streams stay independent across replicas.
        """
        self._draws += 1
        key = self._shared if stream == DIRECTIONS_STREAM else self._key
        seed = tf.random.experimental.stateless_fold_in(
            tf.random.experimental.stateless_fold_in(key, stream), self._draws
        )
        return tf.random.stateless_normal(shape, seed=seed, dtype=dtype)


def _replica_id() -> tf.Tensor | None:
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return tf.cast(context.replica_id_in_sync_group, tf.int64)


def num_replicas() -> int:
    """Replicas that each add their share of the noise (1 without tf.distribute)."""
    context = tf.distribute.get_replica_context()
    if context is None:  # cross-replica context
        return tf.distribute.get_strategy().num_replicas_in_sync
    return int(context.num_replicas_in_sync)


def step_randomness(rng: Any) -> StepRandomness:
    """``rng`` if it already is a :class:`StepRandomness`, else a fresh step from it."""
    if isinstance(rng, StepRandomness):
        return rng
    return StepRandomness(resolve_generator(rng))


def secret_key(generator: tf.random.Generator) -> tf.Variable:
    """A 128-bit key drawn from ``generator`` once, in a variable (keep it untracked)."""
    with tf.init_scope():
        return tf.Variable(generator.make_seeds(1)[:, 0], trainable=False, name="fdp_directions_key")


def add_gaussian_noise(
    gradients: Sequence[tf.Tensor], stddev: tf.Tensor | float, rng: Any = None
) -> list[tf.Tensor]:
    """g + stddev * N(0, I) per tensor; stddev = sigma C / B (Alg. 1, line 14).

    Under ``tf.distribute`` with k replicas whose results are summed, each replica
    adds an independent share of std ``stddev / sqrt(k)``, so the sum carries
    N(0, stddev^2 I) exactly once: never k copies of one draw (std k * stddev),
    never less.

    Args:
      gradients: the clipped sums, one tensor per variable.
      stddev: the total noise std.
      rng: ``tf.random.Generator``, a :class:`StepRandomness`, or ``None`` (OS entropy).
    """
    draws = step_randomness(rng)
    return [
        g + draws.normal(tf.shape(g), g.dtype, NOISE_STREAM) * noise_scale(stddev, g.dtype)
        for g in gradients
    ]


#: Machine epsilon (the spacing of the numbers in [1, 2)) and smallest normal number of
#: the floating-point dtypes a gradient can have.
_PRECISION = {tf.float16: (2.0**-10, 2.0**-14), tf.bfloat16: (2.0**-7, 2.0**-126),
              tf.float32: (2.0**-23, 2.0**-126), tf.float64: (2.0**-52, 2.0**-1022)}


def noise_scale(stddev: tf.Tensor | float, dtype: Any) -> tf.Tensor:
    """One replica's share stddev / sqrt(k) in ``dtype``, rounded up, never down.

    A Python number is taken in float64 (``tf.cast`` of a Python float went through
    float32 first); the share's float64 roundings (sigma C / B and / sqrt(k), each at most
    2^-53 relative) are covered by raising it 2^-50, and the round-to-nearest cast into
    ``dtype`` (at most eps / 2 relative) by raising it two units eps first, so the noise's
    std is at least what the accountant assumes. A share below the dtype's smallest normal
    number is raised to it (more noise, never less). Before, the std of a Python sigma C / B
    went through float32 and was up to 2^-25 relative below it for about half of all values."""
    dtype = tf.as_dtype(dtype)
    if dtype not in _PRECISION:
        raise ValueError(f"gradients of dtype {dtype.name} cannot carry the noise; "
                         f"allowed: {', '.join(d.name for d in _PRECISION)}")
    eps, smallest = _PRECISION[dtype]
    exact = tf.constant(stddev, tf.float64) if isinstance(stddev, (int, float)) else tf.cast(stddev, tf.float64)
    share = exact / np.sqrt(num_replicas()) * (1.0 + 2.0**-50)
    if dtype != tf.float64:
        share = share * (1.0 + 2.0 * eps)
    scaled = tf.cast(share, dtype)
    return tf.where(share > 0, tf.maximum(scaled, tf.constant(smallest, dtype)), scaled)
