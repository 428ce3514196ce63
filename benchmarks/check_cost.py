"""What the run-time privacy checks cost: the same step with and without them, interleaved.

The checks of every private step (``fdp_tf.verify``): one loss per input row, the
non-trainable weights compared before and after the step, the read of the
verification flags (whether this trace still needs its probe, whether the
first-choice method failed), the rerun on the examples whose loss or norm is not
finite and, for exact layer-wise clipping, the coverage check (the tape's gradient
of the weights, which only the uses the taps missed reach). Their cost is a ratio
of two step times of one process, so this script measures it without the drift of
a shared machine: for each model it traces a non-DP step, each DP step with the
checks and the same DP step without them, then calls them in turn, round after
round (the order rotates), on the same Poisson batch sizes. Reported: the median
step time of each variant and the median over rounds of the paired ratio
checked / unchecked, with its interquartile range.

The first step of every trace also runs the probe (row independence, 1 + 2
ceil(log2 b) passes, and the per-example method against the batch gradient). The
"probe" variants reset the verification flags before every step, so that every
step probes; their time minus the checked step's is what the probe adds to the
first step. The first call of each variant (tracing included) is reported too.

    python benchmarks/check_cost.py [--models mnist imdb frozen] [--rounds 40] [--probe-rounds 3]
        [--parts] [--json PATH] [--quick]

``--parts`` also times each DP step with one check switched off at a time (the parts
inside the verified step too: the probe's ``tf.cond``, the method fallback's
``tf.cond``, the non-finite rerun, the state guard, the release gate, the refusal
record); what the step loses without a part is that part's cost.

The unchecked variants exist only inside this script (a patch of three functions
while they trace); what they release is still clipped and noised, but nothing is
verified, so on a model that mixes rows it is not private.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from typing import Any, Callable, Iterator

from training import L2_NORM_CLIP, LEARNING_RATE, NOISE_MULTIPLIER, _build, _data, _quantile

VARIANTS = ("non-DP", "JL r=1", "JL r=1, checks off", "JL r=1, probe", "exact", "exact, checks off",
            "exact, probe", "exact, again")
#: "exact, again" is "exact" traced a second time: its paired ratio to "exact" is the
#: measurement's noise floor (zero cost, up to timing noise).


class _NoStateGuard:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def check(self) -> list[Any]:
        return []


def _part_patches() -> dict[str, tuple[Any, str, Callable[[Any], Any]]]:
    """Each run-time check as (module, attribute, replacement given the original)."""
    import fdp_tf.model
    import fdp_tf.optimizers
    import fdp_tf.per_example
    import fdp_tf.verify as verify

    def bare(original: Any) -> Any:
        return lambda optimizer, forward_fn, variables, model, *rest: optimizer._private_gradient(
            forward_fn, list(variables), model)

    def uncovered(original: Any) -> Any:
        return lambda *args, **kwargs: original(*args, **{**kwargs, "check": False})

    def no_fallback(original: Any) -> Any:
        return lambda optimizer, model: original(optimizer, model)[:2] + (None,)

    return {
        # the whole verified step: everything below that is inside it
        "verified step": (fdp_tf.optimizers, "verified_private_gradient", bare),
        "probe cond": (verify, "_cond", lambda original: lambda pred, true_fn, false_fn: false_fn()),
        "method fallback": (verify, "methods", no_fallback),
        "non-finite rerun": (verify, "without_nonfinite_examples", lambda original: lambda result, *a: result),
        "state guard": (verify, "StateGuard", lambda original: _NoStateGuard),
        "release gate": (verify, "gated", lambda original: lambda tensors, checks: list(tensors)),
        "refusal record": (verify, "recording", lambda original: lambda record: contextlib.nullcontext()),
        # outside the verified step
        "one loss per row": (fdp_tf.model, "one_loss_per_row", lambda original: lambda losses, inputs: losses),
        "coverage": (fdp_tf.per_example, "layerwise_norms", uncovered),
        "host read": (verify, "raise_recorded_refusals", lambda original: lambda optimizer: None),
    }


#: What ``--parts`` switches off one at a time (the parts inside the verified step too).
PARTS = ("verified step", "probe cond", "method fallback", "non-finite rerun", "state guard", "release gate",
         "refusal record", "one loss per row", "coverage", "host read")
#: What "checks off" switches off: the verified step holds the first seven parts.
ALL_CHECKS = ("verified step", "one loss per row", "coverage", "host read")


@contextlib.contextmanager
def without(*parts: str) -> Iterator[None]:
    """Switch off the named run-time checks (``PARTS``) while tracing and running."""
    patches = _part_patches()
    saved = []
    try:
        for part in parts:
            module, name, replacement = patches[part]
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, replacement(getattr(module, name)))
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


def without_checks() -> contextlib.AbstractContextManager[None]:
    """Switch off every run-time check: the verified step (probe, state guard, method
    fallback, non-finite rerun, release gate), the one-loss-per-row check, the coverage
    check and the host's read of the refusal counter after each step."""
    return without(*ALL_CHECKS)


def _frozen_model() -> Any:
    """Dense(1024) frozen (263,168 non-trainable values: what the state guard compares
    every step) -> Dense(10)."""
    import keras

    frozen = keras.layers.Dense(1024, activation="relu")
    model = keras.Sequential([keras.Input((256,)), frozen, keras.layers.Dense(10)])
    frozen.trainable = False
    return model


def _frozen_data(n: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 256)).astype("float32"), rng.integers(0, 10, size=n).astype("int32")


def _step_function(model_name: str, variant: str, batch: int, length: int,
                   rounds: int, block: int = 1) -> tuple[Callable[[], float], float]:
    """A traced training step of one variant (calling it runs ``block`` steps and returns
    seconds per step) and the seconds of its first call, tracing included."""
    import warnings

    import keras
    import tensorflow as tf

    import fdp_tf

    x, y = _frozen_data(16 * batch) if model_name == "frozen" else _data(model_name, 16 * batch, length)
    model = _frozen_model() if model_name == "frozen" else _build(model_name, length)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    dp = dict(l2_norm_clip=L2_NORM_CLIP, noise_multiplier=NOISE_MULTIPLIER, learning_rate=LEARNING_RATE)
    if variant == "non-DP":
        model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=loss, jit_compile=False)
        trained = model
    else:
        optimizer = fdp_tf.DPAdamJL(jl_projections=1, **dp) if variant.startswith("JL") else fdp_tf.DPAdamVanilla(**dp)
        trained = fdp_tf.make_private(model, optimizer=optimizer, loss=loss)
    with warnings.catch_warnings():
        # seed=0 (not private, warned): every variant trains on the same batch sizes
        warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        data = fdp_tf.poisson_batches(x, y, expected_batch_size=batch, steps_per_epoch=block * rounds + 2, seed=0)
    checks = _patch_of(variant)
    # fit once for two steps: it builds the optimizer and the private-step state
    start = time.perf_counter()
    with checks():
        trained.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
        train = trained.make_train_function()
    first = time.perf_counter() - start
    iterator = iter(data.repeat())
    flags = getattr(getattr(trained, "optimizer", None), "_dp_step_checks", None)

    def one() -> float:
        if variant.endswith("probe") and flags is not None:
            flags.verified.assign(tf.zeros_like(flags.verified))  # every trace probes again
        with checks():  # a retrace (a new batch shape) must see the same patch
            start = time.perf_counter()
            logs = train(iterator)
            float(keras.ops.convert_to_numpy(logs["loss"]))  # the step has finished
            return time.perf_counter() - start

    def step() -> float:
        return sum(one() for _ in range(block)) / block

    one()  # traces
    return step, first


def _patch_of(variant: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    if variant.endswith("checks off"):
        return without_checks
    if ", without " in variant:
        part = variant.split(", without ", 1)[1]
        return lambda: without(part)
    return contextlib.nullcontext


def variants(parts: bool) -> tuple[str, ...]:
    """The steps measured; with ``parts``, also each DP step without one check."""
    if not parts:
        return VARIANTS
    return VARIANTS + tuple(f"{opt}, without {part}" for opt in ("JL r=1", "exact") for part in PARTS)


def measure(model_name: str, rounds: int, batch: int, length: int, probe_rounds: int = 3,
            parts: bool = False, block: int = 1) -> dict[str, Any]:
    names = variants(parts)
    built = {v: _step_function(model_name, v, batch, length, rounds, 1 if v.endswith("probe") else block)
             for v in names}
    steps = {v: f for v, (f, _) in built.items()}
    times: dict[str, list[float]] = {v: [] for v in names}
    every = [v for v in names if not v.endswith("probe")]  # the probe steps are slow: fewer rounds
    for k in range(rounds):
        order = every[k % len(every):] + every[: k % len(every)]
        for v in order:
            times[v].append(steps[v]())
    for k in range(probe_rounds):
        for name in ("JL r=1", "exact"):
            times[f"{name}, probe"].append(steps[f"{name}, probe"]())
            times[f"{name}, probe base"] = times.get(f"{name}, probe base", []) + [steps[name]()]
    out: dict[str, Any] = {"model": model_name, "batch": batch, "rounds": rounds, "block": block,
                           "seconds": {v: statistics.median(t) for v, t in times.items()},
                           "first fit of two steps": {v: first for v, (_, first) in built.items()}}
    floor = [a / b for a, b in zip(times["exact"], times["exact, again"])]
    out["noise floor"] = {"median": statistics.median(floor) - 1, "q25": _quantile(floor, 0.25) - 1,
                          "q75": _quantile(floor, 0.75) - 1}
    for name in ("JL r=1", "exact"):
        ratios = [a / b for a, b in zip(times[name], times[f"{name}, checks off"])]
        out[f"cost {name}"] = {"median": statistics.median(ratios) - 1,
                               "q25": _quantile(ratios, 0.25) - 1, "q75": _quantile(ratios, 0.75) - 1}
        out[f"probe {name}"] = statistics.median(
            [a - b for a, b in zip(times[f"{name}, probe"], times[f"{name}, probe base"])])
        for part in PARTS if parts else ():
            ratios = [a / b for a, b in zip(times[name], times[f"{name}, without {part}"])]
            out[f"part {name}: {part}"] = {"median": statistics.median(ratios) - 1,
                                           "q25": _quantile(ratios, 0.25) - 1, "q75": _quantile(ratios, 0.75) - 1}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=["mnist", "imdb", "frozen"], default=["mnist", "imdb"],
                        help="frozen: a dense model with a frozen 256x1024 layer (the state guard's cost)")
    parser.add_argument("--rounds", type=int, default=40, help="timed blocks per variant, interleaved")
    parser.add_argument("--block", type=int, default=1,
                        help="steps per timed block (longer blocks average out a shared machine's jitter)")
    parser.add_argument("--probe-rounds", type=int, default=3, help="probing steps per optimizer")
    parser.add_argument("--batch-size", type=int, default=64, help="IMDb expected batch")
    parser.add_argument("--mnist-batch-size", type=int, default=256)
    parser.add_argument("--length", type=int, default=150, help="IMDb tokens per review")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--parts", action="store_true",
                        help="also time each DP step with one check off at a time (what each part costs)")
    parser.add_argument("--quick", action="store_true", help="smoke test: batches 8 / 4, 10 tokens, 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.mnist_batch_size, args.length, args.rounds = 4, 8, 10, 3
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3; got {args.rounds}")
    if args.block < 1:
        parser.error(f"--block must be >= 1; got {args.block}")
    results = []
    for name in args.models:
        batch = args.batch_size if name == "imdb" else args.mnist_batch_size
        result = measure(name, args.rounds, batch, args.length, args.probe_rounds, args.parts, args.block)
        results.append(result)
        print(f"\n{name}, expected batch {batch}, {args.rounds} interleaved rounds of {args.block} step(s)")
        print("| variant | s/step (median) | × non-DP | first fit, 2 steps (s) |")
        print("|---|---|---|---|")
        base = result["seconds"]["non-DP"]
        for v in variants(args.parts):
            print(f"| {v} | {result['seconds'][v]:.4f} | {result['seconds'][v] / base:.2f}× "
                  f"| {result['first fit of two steps'][v]:.1f} |")
        for opt in ("JL r=1", "exact"):
            c = result[f"cost {opt}"]
            print(f"checks cost, {opt}: {100 * c['median']:+.1f} % of the step "
                  f"(paired ratio, IQR {100 * c['q25']:+.1f} … {100 * c['q75']:+.1f} %); "
                  f"the probe adds {result[f'probe {opt}']:.3f} s to the first step of a trace")
        c = result["noise floor"]
        print(f"noise floor (exact against itself, traced twice): {100 * c['median']:+.1f} % "
              f"(IQR {100 * c['q25']:+.1f} … {100 * c['q75']:+.1f} %)")
        if args.parts:
            print("| part (switched off alone) | cost, JL r=1 (IQR) | cost, exact (IQR) |")
            print("|---|---|---|")
            for part in PARTS:
                cells = [result[f"part {opt}: {part}"] for opt in ("JL r=1", "exact")]
                print(f"| {part} | " + " | ".join(
                    f"{100 * c['median']:+.1f} % ({100 * c['q25']:+.1f} … {100 * c['q75']:+.1f})" for c in cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
