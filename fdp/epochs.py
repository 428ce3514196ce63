"""Epochs, the one convention: Poisson sampling at rate p = B / N, ceil(N / B) steps per epoch.

DP-SGD with Poisson sampling draws each batch by keeping every one of the N
examples independently with probability p = B / N, so batches have B examples
on average. One *epoch* is

    steps_per_epoch = ceil(N / B)                                            (1)

such draws (at least one expected pass over the data; what
``fdp_tf.poisson_batches`` yields per epoch), and E epochs, E possibly
fractional, are

    steps = ceil(E * ceil(N / B))                                            (2)

steps: a partial epoch is rounded *up* to whole steps, so the epsilon of (2) is
never below that of the steps actually run. E is read as the decimal the user
wrote (``0.3`` is 3/10, not the float below it), so (2) is exact.

``fdp.dpsgd`` answers the common question in one call: the accountant of E epochs
of (JL-)DP-SGD, ready for ``get_epsilon_bounds(delta)``.

Random allocation (``sampling="random_allocation"``, :class:`fdp.RandomAllocation`):
an epoch is exactly t = ceil(N / B) steps, each example used in one of them (batches
of N / t examples on average); E epochs are ceil(E) such epochs — the first steps of
an epoch reveal no more than the whole epoch (post-processing), so a partial epoch is
charged as a whole one.

Sampling without replacement (``sampling="without_replacement"``,
:class:`fdp.SampledWithoutReplacement`): every step a batch of exactly B examples,
⌈E ⌈N/B⌉⌉ steps as for Poisson, under the *replace-one* relation (its epsilon is for
replacing one example, not adding or removing one).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from fdp._validation import check_integer, check_real, format_value

__all__ = ["SAMPLING_SCHEMES", "dpsgd", "epochs_to_steps", "sampling_rate", "steps_per_epoch"]

#: The batch samplings ``dpsgd`` accounts (``fdp_tf.poisson_batches`` draws the first).
SAMPLING_SCHEMES = ("poisson", "random_allocation", "without_replacement")


def _batch_and_dataset(batch_size: Any, dataset_size: Any) -> tuple[int, int]:
    n = check_integer("dataset_size", dataset_size, low=1)
    b = check_integer("batch_size", batch_size, low=1)
    if b > n:
        raise ValueError(f"batch_size must be an integer in [1, dataset_size={n}]; got {format_value(batch_size)}")
    return b, n


def sampling_rate(batch_size: int, dataset_size: int) -> float:
    """p = B / N, the Poisson sampling rate of an expected batch of B among N examples."""
    b, n = _batch_and_dataset(batch_size, dataset_size)
    return b / n


def steps_per_epoch(batch_size: int, dataset_size: int) -> int:
    """ceil(N / B), equation (1): Poisson draws per epoch."""
    b, n = _batch_and_dataset(batch_size, dataset_size)
    return -(-n // b)


def epochs_to_steps(epochs: float, batch_size: int, dataset_size: int) -> int:
    """ceil(E * ceil(N / B)), equation (2); a partial epoch counts its started step.

    Raises:
      ValueError: epochs not a finite number > 0, or batch_size/dataset_size invalid.
    """
    e = check_real("epochs", epochs, low=0.0, low_inclusive=False)
    per_epoch = steps_per_epoch(batch_size, dataset_size)
    exact = Fraction(repr(e)) if isinstance(epochs, float) else Fraction(e)
    steps = math.ceil(exact * per_epoch)
    if steps > 10**12:
        raise ValueError(f"epochs must be in (0, {10**12 / per_epoch:.6g}] ({per_epoch} steps per epoch, at most "
                         f"10^12 steps); got {format_value(epochs)}, {steps:.3g} steps")
    return steps


def dpsgd(
    *,
    noise_multiplier: float,
    batch_size: int,
    dataset_size: int,
    epochs: float | None = None,
    jl_projections: int | None = None,
    accountant: Any = None,
    sampling: str = "poisson",
    selected: int = 1,
    steps: int | None = None,
) -> Any:
    """The accountant of ``epochs`` epochs of DP-SGD (or DP-SGD-JL with r projections).

    ``sampling="poisson"``: each step is the Poisson-subsampled Gaussian mechanism at
    p = B / N (:class:`fdp.Gaussian`), or with ``jl_projections`` = r the JL mechanism
    of DP-SGD-JL (:class:`fdp.JL`), composed over :func:`epochs_to_steps` steps.
    ``sampling="random_allocation"``: ceil(E) epochs of t = ceil(N k / B) steps, each
    example in exactly k = ``selected`` steps per epoch, so a step's expected batch is
    N k / t ~ B (:class:`fdp.RandomAllocation`, of the Gaussian step or, with
    ``jl_projections`` and k = 1, of the JL step).
    ``sampling="without_replacement"``: the same steps, each on exactly B examples drawn
    without replacement, under replace-one (:class:`fdp.SampledWithoutReplacement`; a
    replaced example moves the clipped sum by up to 2C, so the step's noise multiplier
    there is sigma / 2; DP-SGD only).

    Args:
      noise_multiplier: sigma > 0 (noise std / clipping norm).
      batch_size: expected batch size B in [1, N].
      dataset_size: N >= 1.
      epochs: E > 0 (fractional allowed; see :mod:`fdp.epochs`); or give ``steps``.
      jl_projections: r >= 1 for DP-SGD-JL; ``None`` for DP-SGD.
      accountant: an :class:`fdp.PLDAccountant` with the settings to use; the steps
        are recorded on it, after any events it holds. Default: a new one.
      sampling: how batches are drawn, one of :data:`SAMPLING_SCHEMES`.
      selected: k >= 1, the steps each example is used in per epoch
        (``sampling="random_allocation"`` only; k > 1 for DP-SGD only).
      steps: T >= 1 steps run, instead of ``epochs`` (random allocation charges
        ceil(T / t) whole epochs).

    Returns:
      The ``fdp.PLDAccountant`` holding the run, ready for queries such as
      ``.get_epsilon_bounds(delta=1e-5)``.

    Examples:
      >>> import fdp
      >>> acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=60)
      >>> lo, hi = acc.get_epsilon_bounds(delta=1e-5)   # ~ (2.384, 2.385), 14,100 steps
    """
    from fdp.accountant import PLDAccountant
    from fdp.mechanisms.gaussian import Gaussian

    if sampling not in SAMPLING_SCHEMES:
        raise ValueError(f"sampling must be one of {list(SAMPLING_SCHEMES)}; got {format_value(sampling)}")
    if (epochs is None) == (steps is None):
        raise ValueError("give exactly one of epochs=E (passes over the data) or steps=T (steps run); got "
                         f"epochs={format_value(epochs)}, steps={format_value(steps)}")
    p = sampling_rate(batch_size, dataset_size)  # checks batch_size and dataset_size
    if steps is not None:
        steps = check_integer("steps", steps, low=1, high=10**12)
    else:
        steps = epochs_to_steps(epochs, batch_size, dataset_size)
    selected = check_integer("selected", selected, low=1)
    if selected != 1 and sampling != "random_allocation":
        raise ValueError(f"selected={selected} (steps per example per epoch) is for sampling='random_allocation'; "
                         f"got sampling={sampling!r}: leave selected=1")
    if sampling == "without_replacement" and jl_projections is not None:
        raise ValueError(f"sampling={sampling!r} is accounted for DP-SGD only (jl_projections=None); "
                         f"got jl_projections={format_value(jl_projections)}: use sampling='poisson' or "
                         "'random_allocation'")
    if sampling == "without_replacement":
        from fdp.mechanisms.without_replacement import SampledWithoutReplacement

        sigma = check_real("noise_multiplier", noise_multiplier, low=0.0, low_inclusive=False)
        mechanism = SampledWithoutReplacement(Gaussian(noise_multiplier=sigma / 2), sample_size=batch_size,
                                              dataset_size=dataset_size)
    elif sampling == "random_allocation":
        from fdp.mechanisms.random_allocation import RandomAllocation

        t = -(-int(dataset_size) * selected // int(batch_size))  # ceil(N k / B), B and N checked above
        if jl_projections is None:
            step: Any = Gaussian(noise_multiplier=noise_multiplier)
        else:
            from fdp.mechanisms.jl import JL

            step = JL(noise_multiplier=noise_multiplier, jl_projections=jl_projections)
        mechanism = RandomAllocation(step, steps_per_epoch=t, selected=selected)
        # whole epochs: a partial one is charged as a whole one
        steps = -(-steps // (t if epochs is None else steps_per_epoch(batch_size, dataset_size)))
    elif jl_projections is None:
        mechanism = Gaussian(noise_multiplier=noise_multiplier, sampling_rate=p)
    else:
        from fdp.mechanisms.jl import JL

        mechanism = JL(noise_multiplier=noise_multiplier, jl_projections=jl_projections, sampling_rate=p)
    if accountant is None:
        accountant = PLDAccountant()
    elif not isinstance(accountant, PLDAccountant):
        raise ValueError(f"accountant must be an fdp.PLDAccountant or None; got {type(accountant).__name__}")
    return accountant.compose(mechanism, steps=steps)
