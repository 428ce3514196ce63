"""What the run-time privacy checks cost: the same step with and without them, interleaved.

The checks of a private step are the rerun on the examples with a finite loss
(every optimizer) and, for exact layer-wise clipping, the coverage check (the
tape's gradient of the weights, which only the uses the taps missed reach; see
``fdp_tf.layerwise.escaped_gradients_vanish``). Their cost is a ratio of two
step times of one process, so this script measures it without the drift of a
shared machine: for each model it traces a non-DP step, each DP step with the
checks and the same DP step without them, then calls them in turn, round after
round (the order rotates), on the same Poisson batch sizes. Reported: the median
step time of each variant and the median over rounds of the paired ratio
checked / unchecked, with its interquartile range.

    python benchmarks/check_cost.py [--models mnist imdb] [--rounds 40] [--json PATH] [--quick]

The unchecked variants exist only inside this script (a patch of two functions
while they trace); what they release is still the taps' reconstruction, so they
are private, but on a model that reads a weight outside its layer their
gradient is not the model's.
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

VARIANTS = ("non-DP", "JL r=1", "JL r=1, checks off", "exact", "exact, checks off")


@contextlib.contextmanager
def without_checks() -> Iterator[None]:
    """Switch off the checks (the non-finite rerun and the layer-wise coverage check)."""
    import fdp_tf.optimizers
    import fdp_tf.per_example

    checked = fdp_tf.per_example.layerwise_norms

    def unchecked(*args: Any, **kwargs: Any) -> Any:
        return checked(*args, **{**kwargs, "check": False})

    saved = fdp_tf.optimizers.without_nonfinite_examples
    fdp_tf.optimizers.without_nonfinite_examples = lambda result, rerun: result
    fdp_tf.per_example.layerwise_norms = unchecked
    try:
        yield
    finally:
        fdp_tf.optimizers.without_nonfinite_examples = saved
        fdp_tf.per_example.layerwise_norms = checked


def _step_function(model_name: str, variant: str, batch: int, length: int, rounds: int) -> Callable[[], float]:
    """A traced training step of one variant; calling it runs one step and returns seconds."""
    import warnings

    import keras

    import fdp_tf

    x, y = _data(model_name, 16 * batch, length)
    model = _build(model_name, length)
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
        data = fdp_tf.poisson_batches(x, y, expected_batch_size=batch, steps_per_epoch=rounds + 2, seed=0)
    checks = without_checks if variant.endswith("checks off") else contextlib.nullcontext
    # fit once for two steps: it builds the optimizer and the private-step state
    with checks():
        trained.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
        train = trained.make_train_function()
    iterator = iter(data.repeat())

    def step() -> float:
        with checks():  # a retrace (a new batch shape) must see the same patch
            start = time.perf_counter()
            logs = train(iterator)
            float(keras.ops.convert_to_numpy(logs["loss"]))  # the step has finished
            return time.perf_counter() - start

    step()  # traces
    return step


def measure(model_name: str, rounds: int, batch: int, length: int) -> dict[str, Any]:
    steps = {v: _step_function(model_name, v, batch, length, rounds) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(rounds):
        order = VARIANTS[k % len(VARIANTS):] + VARIANTS[: k % len(VARIANTS)]
        for v in order:
            times[v].append(steps[v]())
    out: dict[str, Any] = {"model": model_name, "batch": batch, "rounds": rounds,
                           "seconds": {v: statistics.median(t) for v, t in times.items()}}
    for name in ("JL r=1", "exact"):
        ratios = [a / b for a, b in zip(times[name], times[f"{name}, checks off"])]
        out[f"cost {name}"] = {"median": statistics.median(ratios) - 1,
                               "q25": _quantile(ratios, 0.25) - 1, "q75": _quantile(ratios, 0.75) - 1}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=["mnist", "imdb"], default=["mnist", "imdb"])
    parser.add_argument("--rounds", type=int, default=40, help="steps per variant, interleaved")
    parser.add_argument("--batch-size", type=int, default=64, help="IMDb expected batch")
    parser.add_argument("--mnist-batch-size", type=int, default=256)
    parser.add_argument("--length", type=int, default=150, help="IMDb tokens per review")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="smoke test: batches 8 / 4, 10 tokens, 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.mnist_batch_size, args.length, args.rounds = 4, 8, 10, 3
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3; got {args.rounds}")
    results = []
    for name in args.models:
        batch = args.batch_size if name == "imdb" else args.mnist_batch_size
        result = measure(name, args.rounds, batch, args.length)
        results.append(result)
        print(f"\n{name}, expected batch {batch}, {args.rounds} interleaved rounds")
        print("| variant | s/step (median) | × non-DP |")
        print("|---|---|---|")
        base = result["seconds"]["non-DP"]
        for v in VARIANTS:
            print(f"| {v} | {result['seconds'][v]:.4f} | {result['seconds'][v] / base:.2f}× |")
        for opt in ("JL r=1", "exact"):
            c = result[f"cost {opt}"]
            print(f"checks cost, {opt}: {100 * c['median']:+.1f} % of the step "
                  f"(paired ratio, IQR {100 * c['q25']:+.1f} … {100 * c['q75']:+.1f} %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
