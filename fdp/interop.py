"""dp_accounting interop: ``fdp.from_dp_event(event)`` accounts a ``dp_accounting.DpEvent``.

A pipeline that describes its mechanism as a DpEvent tree switches accountant in one
line::

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000)
    fdp.from_dp_event(event).get_epsilon_bounds(delta=1e-5)

The events map to fdp mechanisms with the same laws and the same neighbouring
relation: add or remove one example for the Gaussian and Laplace (both directions
are composed), replace one value for randomized response (the pair of output laws
of two different inputs; dp_accounting accounts it only under REPLACE_ONE):

    GaussianDpEvent(sigma)                 -> fdp.Gaussian(noise_multiplier=sigma)
    LaplaceDpEvent(b)                      -> fdp.Laplace(scale=b)
    RandomizedResponseDpEvent(eta, k)      -> the true bucket with probability 1 - eta,
                                              else one of k uniformly (k = 2: fdp.RandomizedResponse
                                              with e^eps = (2 - eta) / eta; k > 2: three outcomes
                                              "true", "the neighbour's", "another", fdp.FromDistributions)
    PoissonSampledDpEvent(q, Gaussian or Laplace) -> the same with sampling_rate = q
    SampledWithoutReplacementDpEvent(N, B, Gaussian)
                                           -> fdp.SampledWithoutReplacement (replace one example:
                                              the event's noise is relative to the sensitivity
                                              between batches that differ in one replaced example,
                                              as dp_accounting reads it under REPLACE_ONE)
    SelfComposedDpEvent(e, n), ComposedDpEvent([...]), NoOpDpEvent -> composition

Null events release nothing about anyone and are left out: NoOpDpEvent, Poisson
sampling with probability 0 (of any event), a Gaussian or Laplace event with infinite
noise, ComposedDpEvent([]) and SelfComposedDpEvent(e, 0). An accountant of null events
only holds one step of the null mechanism ``fdp.RandomizedResponse(epsilon=0)``, so its
queries answer epsilon = delta = 0 (upper bounds ~1e-14: the certified float round-off),
where dp_accounting's accountants answer 0.

Anything else (sampling with replacement, single-epoch tree aggregation, a
non-private event, Poisson sampling of a composition) is refused with a
ValueError that names it: its privacy is not the composition above.
dp_accounting is an optional dependency (``pip install dp-accounting``); fdp only
reads the events' attributes.
"""

from __future__ import annotations

from typing import Any

import math

from fdp._validation import check_integer, check_probability
from fdp.accountant import PLDAccountant
from fdp.mechanisms.base import Mechanism

__all__ = ["from_dp_event", "mechanisms_of_event"]

_SUPPORTED = ("GaussianDpEvent", "LaplaceDpEvent", "RandomizedResponseDpEvent", "PoissonSampledDpEvent",
              "SampledWithoutReplacementDpEvent", "SelfComposedDpEvent", "ComposedDpEvent", "NoOpDpEvent")


def from_dp_event(event: Any, accountant: PLDAccountant | None = None) -> PLDAccountant:
    """A :class:`fdp.PLDAccountant` with ``event``'s mechanisms composed.

    Args:
      event: a ``dp_accounting.DpEvent`` built from the events listed in :mod:`fdp.interop`.
      accountant: an accountant whose settings to use (the events are recorded on it);
        default a new one.

    Raises:
      ValueError: an event type fdp does not account (the message names it), or a
        parameter out of range (e.g. a zero noise multiplier: not private).
    """
    acc = PLDAccountant() if accountant is None else accountant
    if not isinstance(acc, PLDAccountant):
        raise ValueError(f"accountant must be an fdp.PLDAccountant or None; got {type(acc).__name__}")
    pairs = mechanisms_of_event(event)
    if not pairs and not acc.events:  # only null events: not an empty accountant, which queries refuse
        from fdp.mechanisms.discrete import RandomizedResponse

        pairs = [(RandomizedResponse(epsilon=0.0), 1)]
    for mech, count in pairs:
        acc.compose(mech, steps=count)
    return acc


def mechanisms_of_event(event: Any) -> list[tuple[Mechanism, int]]:
    """``event`` as a list of (mechanism, count), in order; null events give none."""
    name = type(event).__name__
    if name == "NoOpDpEvent" or (name in ("GaussianDpEvent", "LaplaceDpEvent") and _infinite(event.noise_multiplier)):
        return []  # infinite noise: the output does not depend on the data
    if name == "ComposedDpEvent":
        return [pair for inner in event.events for pair in mechanisms_of_event(inner)]
    if name == "SelfComposedDpEvent":
        count = check_integer("SelfComposedDpEvent.count", event.count, low=0)
        return [(m, c * count) for m, c in mechanisms_of_event(event.event) if c * count > 0]
    if name == "PoissonSampledDpEvent":
        q = check_probability("PoissonSampledDpEvent.sampling_probability", event.sampling_probability)
        if q == 0.0 or not mechanisms_of_event(event.event):
            return []  # nobody's data is used, or the sampled event is null
        inner = type(event.event).__name__
        if inner not in ("GaussianDpEvent", "LaplaceDpEvent"):
            raise ValueError(
                f"PoissonSampledDpEvent of a {inner} is not supported: fdp accounts Poisson sampling of one "
                "Gaussian or Laplace step (sample each step, then compose: "
                "SelfComposedDpEvent(PoissonSampledDpEvent(q, step), n)); randomized response is a "
                "replace-one pair, for which subsampling has no add/remove meaning")
        return [(_step(event.event, q), 1)]
    if name == "SampledWithoutReplacementDpEvent":
        return _without_replacement(event)
    if name in ("GaussianDpEvent", "LaplaceDpEvent", "RandomizedResponseDpEvent"):
        return [(_step(event, 1.0), 1)]
    raise ValueError(
        f"{name} is not supported by fdp.from_dp_event; supported events: {', '.join(_SUPPORTED)}"
        + (" (a non-private event has epsilon = inf)" if name == "NonPrivateDpEvent" else ""))


def _without_replacement(event: Any) -> list[tuple[Mechanism, int]]:
    """SampledWithoutReplacementDpEvent(N, B, Gaussian) under replace-one."""
    from fdp.mechanisms.without_replacement import SampledWithoutReplacement

    n = check_integer("SampledWithoutReplacementDpEvent.source_dataset_size", event.source_dataset_size, low=1)
    b = check_integer("SampledWithoutReplacementDpEvent.sample_size", event.sample_size, low=0, high=n)
    if b == 0 or not mechanisms_of_event(event.event):
        return []  # nobody's data is used, or the sampled event is null
    inner = type(event.event).__name__
    if inner != "GaussianDpEvent":
        raise ValueError(f"SampledWithoutReplacementDpEvent of a {inner} is not supported: fdp accounts one "
                         "Gaussian step on a batch drawn without replacement (sample each step, then "
                         "compose: SelfComposedDpEvent(SampledWithoutReplacementDpEvent(N, B, step), n))")
    return [(SampledWithoutReplacement(_step(event.event, 1.0), sample_size=b, dataset_size=n), 1)]


def _infinite(noise: Any) -> bool:
    """Whether a noise parameter is +inf (other values are left to the mechanisms' checks)."""
    try:
        return math.isinf(float(noise)) and float(noise) > 0.0
    except (TypeError, ValueError):
        return False


def _step(event: Any, rate: float) -> Mechanism:
    from fdp.mechanisms.discrete import FromDistributions, RandomizedResponse
    from fdp.mechanisms.gaussian import Gaussian
    from fdp.mechanisms.laplace import Laplace

    name = type(event).__name__
    if name == "GaussianDpEvent":
        return Gaussian(noise_multiplier=float(event.noise_multiplier), sampling_rate=rate)
    if name == "LaplaceDpEvent":
        return Laplace(scale=float(event.noise_multiplier), sampling_rate=rate)
    eta, k = float(event.noise_parameter), int(event.num_buckets)
    if not 0.0 < eta <= 1.0 or k < 2:
        raise ValueError(f"RandomizedResponseDpEvent needs noise_parameter in (0, 1] and num_buckets >= 2; "
                         f"got noise_parameter={event.noise_parameter}, num_buckets={event.num_buckets}")
    if k == 2:  # P(true) = 1 - eta/2 against eta/2
        return RandomizedResponse(epsilon=math.log((2.0 - eta) / eta), sampling_rate=rate)
    keep, other = 1.0 - eta + eta / k, eta / k
    rest = (k - 2) * eta / k
    return FromDistributions((keep, other, rest), (other, keep, rest), sampling_rate=rate)
