"""Budget-first training: the noise multiplier (or the number of JL projections) that
keeps a planned run within epsilon.

A planned run is ``epochs`` passes of one DP optimizer over batches of a known
sampling (a dataset of :func:`fdp_tf.poisson_batches`,
:func:`fdp_tf.random_allocation_batches` or :func:`fdp_tf.without_replacement_batches`,
or their specs). It is exactly what ``fit`` will book in the model's ledger
(:class:`fdp_tf.Segment`): T = epochs x (batches per pass) steps of the optimizer's
mechanism, random allocation in whole epochs. :func:`noise_multiplier_for` returns the
smallest sigma whose *certified* epsilon of that ledger is at most the target
(:func:`fdp.calibrate_noise_multiplier`: a search on the accountant's upper bound, so
the sigma returned meets the budget, never an estimate of it):

    sigma* = min { sigma : eps_up( T steps of mechanism(sigma) ; delta ) <= eps* }.

For DP-SGD-JL at a given sigma, :func:`jl_projections_for` returns instead the fewest
projections r whose planned run meets the budget (:func:`fdp.fewest_jl_projections`;
epsilon falls as r grows, towards exact clipping's, the r -> infinity limit):

    r* = min { r : eps_up( T steps of JL(sigma, r) ; delta ) <= eps* }.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from fdp._validation import check_delta, check_integer, check_real
from fdp_tf.batch_schemes import RandomAllocationSampling, WithoutReplacementSampling
from fdp_tf.ledger import Segment
from fdp_tf.sampling import PoissonSampling, sampling_of

__all__ = ["Budget", "calibrate_optimizer", "jl_projections_for", "noise_multiplier_for", "planned_segment",
           "segment_for", "spec_of"]

_SPECS = (PoissonSampling, RandomAllocationSampling, WithoutReplacementSampling)


@dataclass(frozen=True)
class Budget:
    """What :func:`fdp_tf.make_private` was asked for and chose.

    Attributes:
      target_epsilon: eps*, the budget.
      delta: delta of the budget.
      epochs: passes planned.
      steps: the steps those passes run (what ``fit`` will book).
      noise_multiplier: sigma: chosen (the smallest with certified epsilon <= eps*), or
        given when r was chosen.
      epsilon: the certified upper bound on epsilon after the planned run.
      sampling: the spec of the batches (:class:`fdp_tf.PoissonSampling`, ...).
      jl_projections: r of a JL optimizer (chosen: the fewest with certified epsilon <=
        eps*, when ``chose`` says so); ``None`` for exact clipping.
      chose: which parameter was chosen, ``"noise_multiplier"`` or ``"jl_projections"``.
    """

    target_epsilon: float
    delta: float
    epochs: int
    steps: int
    noise_multiplier: float
    epsilon: float
    sampling: Any
    jl_projections: int | None = None
    chose: str = "noise_multiplier"

    def describe(self) -> str:
        """One line: what was chosen and for what."""
        if self.chose == "jl_projections":
            choice = (f"jl_projections={self.jl_projections} (the fewest) at noise_multiplier="
                      f"{self.noise_multiplier:.4g}")
        else:
            projections = "" if self.jl_projections is None else f" with jl_projections={self.jl_projections}"
            choice = f"noise_multiplier={self.noise_multiplier:.4g}{projections}"
        return (f"{choice} keeps epsilon <= {self.epsilon:.4g} "
                f"(budget {self.target_epsilon:g}) at delta={self.delta:g} after {self.epochs} epochs "
                f"({self.steps:,} steps) of {_scheme_words(self.sampling)} (certified upper bound)")


def _scheme_words(sampling: Any) -> str:
    if isinstance(sampling, PoissonSampling):
        return f"Poisson sampling (p = {sampling.sampling_rate:.4g}, expected batch {sampling.expected_batch_size})"
    if isinstance(sampling, RandomAllocationSampling):
        return (f"random allocation ({sampling.steps_per_epoch} steps per epoch, each example in "
                f"{sampling.selected})")
    return f"batches of {sampling.batch_size} drawn without replacement (replace-one)"


def spec_of(data: Any) -> tuple[Any, int]:
    """(sampling spec, batches per pass) of ``data``: a dataset made by one of fdp_tf's
    samplers (its cardinality when finite) or a spec itself."""
    import tensorflow as tf

    spec = data if isinstance(data, _SPECS) else sampling_of(data)
    if spec is None:
        raise ValueError(
            "data must be a dataset made by fdp_tf.poisson_batches, fdp_tf.random_allocation_batches or "
            "fdp_tf.without_replacement_batches (the one object it returned, not one derived by .map), or "
            f"their spec (fdp_tf.PoissonSampling(...), ...); got {type(data).__name__}. The budget is "
            "spent according to how batches are drawn, so it must be known"
        )
    if isinstance(spec, RandomAllocationSampling):
        return spec, spec.steps_per_epoch
    per_pass = spec.steps_per_epoch or -(-spec.num_examples // spec.expected_batch_size)
    if isinstance(data, tf.data.Dataset):
        cardinality = int(data.cardinality())
        if cardinality > 0:
            per_pass = cardinality
    return spec, per_pass


def segment_for(optimizer: Any, spec: Any, steps: int, noise_multiplier: float | None = None) -> Segment:
    """The ledger entry of ``steps`` steps of ``optimizer`` on batches drawn as ``spec``
    (``None``: unknown sampling, booked at rate 1)."""
    sigma = optimizer.noise_multiplier if noise_multiplier is None else noise_multiplier
    rate = 1.0 if spec is None else spec.sampling_rate
    segment = dataclasses.replace(optimizer.segment(rate, steps), noise_multiplier=sigma)
    if spec is not None and spec.scheme != "poisson":
        segment = dataclasses.replace(segment, sampling=spec.scheme, scheme_size=spec.scheme_size)
    return segment


def planned_segment(optimizer: Any, data: Any, epochs: int, noise_multiplier: float | None = None) -> Segment:
    """The ledger entry ``epochs`` passes of ``optimizer`` over ``data`` would book."""
    epochs = check_integer("epochs", epochs, low=1, high=10**9)
    spec, per_pass = spec_of(data)
    return segment_for(optimizer, spec, epochs * per_pass, noise_multiplier)


def noise_multiplier_for(optimizer: Any, data: Any, *, target_epsilon: float, delta: float, epochs: int,
                         progress: bool = False) -> Budget:
    """The smallest noise multiplier of ``optimizer`` whose planned run stays within budget.

    Args:
      optimizer: a DP optimizer (its kind, C and r for DP-SGD-JL; its noise multiplier
        is not read).
      data: the training batches: a dataset of :func:`fdp_tf.poisson_batches`,
        :func:`fdp_tf.random_allocation_batches` or
        :func:`fdp_tf.without_replacement_batches`, or its spec.
      target_epsilon: eps* > 0.
      delta: delta in (0, 1), e.g. below 1 / N.
      epochs: the passes ``fit`` will run, >= 1.
      progress: a progress bar of the accountant runs on stderr.

    Returns:
      The ``Budget``, with the noise multiplier and the certified epsilon there.

    Raises:
      ValueError: an argument out of range; data of unknown sampling; or a target no
        noise multiplier up to 10^6 meets (the message says so).
    """
    import fdp

    target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_delta(delta)
    plan = planned_segment(optimizer, data, epochs, noise_multiplier=1.0)
    spec, _ = spec_of(data)
    if plan.sampling == "poisson":  # fdp's own start for the Gaussian / JL mechanism
        kind = "jl" if plan.kind == "jl" else "gaussian"
        extra = {"jl_projections": plan.jl_projections} if kind == "jl" else {}
        sigma = fdp.calibrate_noise_multiplier(target_epsilon=target, delta=delta, steps=plan.events(),
                                               sampling_rate=plan.sampling_rate, mechanism=kind,
                                               progress=progress, **extra)
    else:
        sigma = fdp.calibrate_noise_multiplier(
            target_epsilon=target, delta=delta, steps=plan.events(), progress=progress,
            mechanism=lambda s: dataclasses.replace(plan, noise_multiplier=s).mechanism())
    chosen = dataclasses.replace(plan, noise_multiplier=sigma)
    epsilon = _certified(chosen, delta)
    if not epsilon <= target or not math.isfinite(epsilon):  # the search certified it; a second look agrees
        raise AssertionError(f"calibrated sigma={sigma} gives epsilon {epsilon} > {target}")
    return Budget(target_epsilon=target, delta=delta, epochs=int(epochs), steps=plan.steps,
                  noise_multiplier=sigma, epsilon=epsilon, sampling=spec, jl_projections=plan.jl_projections)


def jl_projections_for(optimizer: Any, data: Any, *, target_epsilon: float, delta: float, epochs: int,
                       progress: bool = False) -> Budget:
    """The fewest JL projections r of a DP-SGD-JL optimizer whose planned run stays within
    budget at the optimizer's noise multiplier.

    Args:
      optimizer: a JL optimizer with its noise multiplier (its r is not read).
      data: the training batches: a dataset of :func:`fdp_tf.poisson_batches` or
        :func:`fdp_tf.random_allocation_batches`, or its spec.
      target_epsilon: eps* > 0.
      delta: delta in (0, 1), e.g. below 1 / N.
      epochs: the passes ``fit`` will run, >= 1.
      progress: print each probed r and whether it meets the budget on stderr.

    Returns:
      The ``Budget``, with r, the noise multiplier and the certified epsilon there.

    Raises:
      ValueError: an argument out of range; data of unknown sampling or drawn without
        replacement (accounted for exact clipping only); or a target that exact clipping
        at this sigma (r -> infinity) misses, or no r up to
        :data:`fdp.budget.MAX_JL_PROJECTIONS` meets: the message says to raise sigma.
    """
    import sys

    import fdp

    target = check_real("target_epsilon", target_epsilon, low=0.0, low_inclusive=False)
    delta = check_delta(delta)
    sigma = optimizer.noise_multiplier
    if optimizer.segment(1.0).kind != "jl" or sigma is None:
        raise ValueError("jl_projections_for needs a JL optimizer (fdp_tf.DPSGDJL / DPAdamJL) with its "
                         f"noise_multiplier; got {type(optimizer).__name__} with noise_multiplier={sigma}")
    plan = planned_segment(optimizer, data, epochs)
    spec, _ = spec_of(data)
    report = (lambda r, ok: print(f"jl_projections={r}: {'meets' if ok else 'misses'} the budget",
                                  file=sys.stderr)) if progress else None
    if plan.sampling == "poisson":  # the same search as fdp calibrate's
        r = fdp.fewest_jl_projections(noise_multiplier=sigma, sampling_rate=plan.sampling_rate,
                                      steps=plan.events(), target_epsilon=target, delta=delta, progress=report)
    else:
        if plan.sampling == "without_replacement":  # not accounted for JL: the ledger's refusal
            dataclasses.replace(plan, jl_projections=1).mechanism()
        limit = dataclasses.replace(plan, kind="gaussian", jl_projections=0).mechanism()
        r = fdp.fewest_jl_projections(
            mechanism=lambda r: dataclasses.replace(plan, jl_projections=r).mechanism(), limit=limit,
            steps=plan.events(), target_epsilon=target, delta=delta, progress=report)
    chosen = dataclasses.replace(plan, jl_projections=r)
    epsilon = _certified(chosen, delta)
    if not epsilon <= target or not math.isfinite(epsilon):  # the search certified it; a second look agrees
        raise AssertionError(f"chosen jl_projections={r} gives epsilon {epsilon} > {target}")
    return Budget(target_epsilon=target, delta=delta, epochs=int(epochs), steps=plan.steps, noise_multiplier=sigma,
                  epsilon=epsilon, sampling=spec, jl_projections=r, chose="jl_projections")


def _certified(segment: Segment, delta: float) -> float:
    """The ledger's upper bound on epsilon of ``segment`` (its bracket width is not the
    question, so no warning about it)."""
    import warnings

    from fdp_tf.ledger import PrivacyLedger

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return PrivacyLedger((segment,)).epsilon(delta)


def calibrate_optimizer(optimizer: Any, target_epsilon: float, delta: Any, epochs: Any, data: Any,
                        progress: bool = False) -> Budget:
    """Choose and set what ``optimizer`` left out for a budget (``make_private``): its noise
    multiplier, or r of a JL optimizer given sigma."""
    from fdp_tf.optimizers import DPOptimizer

    if not isinstance(optimizer, DPOptimizer):
        raise ValueError("target_epsilon needs a DP optimizer created without noise_multiplier (e.g. "
                         f"fdp_tf.DPAdamJL(l2_norm_clip=1.0, jl_projections=5)); got {type(optimizer).__name__}")
    missing = optimizer.missing_parameters()
    if not missing:
        raise ValueError(f"give either target_epsilon or the optimizer's noise_multiplier, not both: "
                         f"{type(optimizer).__name__} has noise_multiplier={optimizer.noise_multiplier}. "
                         "Create it without noise_multiplier (or, for DP-SGD-JL, without jl_projections) to have "
                         "it chosen for the budget")
    if len(missing) > 1:
        raise ValueError(f"{type(optimizer).__name__} has neither noise_multiplier nor jl_projections: a budget "
                         "fixes one of them given the other. Give jl_projections=r to have sigma chosen "
                         "(r = 30 or more keeps sigma near exact clipping's), or noise_multiplier=sigma to have the "
                         "fewest r chosen")
    unset = [name for name, value in (("delta", delta), ("epochs", epochs), ("data", data)) if value is None]
    if unset:
        raise ValueError(f"target_epsilon needs {', '.join(unset)} too: the budget's delta, the passes fit "
                         "will run and the dataset it will train on (its sampling decides the cost)")
    if missing == ("jl_projections",):
        budget = jl_projections_for(optimizer, data, target_epsilon=target_epsilon, delta=delta, epochs=epochs,
                                    progress=progress)
        optimizer.calibrated(jl_projections=budget.jl_projections)
    else:
        budget = noise_multiplier_for(optimizer, data, target_epsilon=target_epsilon, delta=delta, epochs=epochs,
                                      progress=progress)
        optimizer.calibrated(budget.noise_multiplier)
    return budget
