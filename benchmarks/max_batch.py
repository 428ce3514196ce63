"""The largest batch each optimizer trains under a memory cap: the seed's two memory tables.

The seed (Bu et al., arXiv:2102.03013v1, Section 4.3) measures memory as the largest
batch an optimizer can run on one 16 GB P100: on the TF Privacy tutorial CNN
(26,010 parameters) non-DP SGD, DP-SGD-JL(10) and JL(30) all reach the whole of MNIST
(60,000) while DP-SGD-Vanilla stops at 512; on a variant widened by dense layers to
17.1 M parameters, non-DP 52,000, JL(10) 28,000, JL(30) 25,000 and Vanilla 100.

Here the cap is on the growth of a process's peak resident memory (VmHWM)
over its size just before the first step (TensorFlow, the model and the batch already
loaded): every (model, optimizer, batch) runs two steps of ``train_on_batch`` (the
first traces) in a fresh Python process. The batch doubles until a run exceeds the cap
(or reaches ``--max-batch``), then bisects to ``--resolution``. Memory does not depend
on the CPU's speed, so the table compares with the seed's as ratios to non-DP.

Models (random data of MNIST's shape; the step's memory does not depend on values):

* ``cnn``: ``examples/mnist_cnn.py``, 26,010 parameters;
* ``cnn17m``: the same CNN with two dense layers of 3,876 units after ``Flatten``,
  17,149,298 parameters (the seed gives the count, 17,146,938, not the layers).

    python benchmarks/max_batch.py [--models cnn cnn17m] [--cap-mib 4096]
        [--optimizers sgd jl10 jl30 exact jl10_double_vjp] [--png max_batch.png] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)

from training import peak_rss_mib  # noqa: E402  (this directory: the script's, or the loader's)

MNIST_TRAIN = 60_000
#: The seed's Tables (largest batch on a 16 GB P100).
SEED = {
    "cnn": {"sgd": 60_000, "exact": 512, "jl10": 60_000, "jl30": 60_000},
    "cnn17m": {"sgd": 52_000, "exact": 100, "jl10": 28_000, "jl30": 25_000},
}
WIDE_UNITS = 3_876
LABELS = {"sgd": "non-DP SGD", "exact": "exact DP-SGD"}


def _label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    r, _, method = name[2:].partition("_")
    return f"DP-SGD-JL({r})" + (f", {method}" if method else "")


def _build(model_name: str):
    import keras
    from mnist_cnn import build_model

    if model_name == "cnn":
        return build_model()
    # the tutorial CNN's layers (examples/mnist_cnn.py), two wide dense layers after Flatten
    layers = keras.layers
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
        layers.MaxPooling2D(2, 1),
        layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
        layers.MaxPooling2D(2, 1),
        layers.Flatten(),
        layers.Dense(WIDE_UNITS, activation="relu"),
        layers.Dense(WIDE_UNITS, activation="relu"),
        layers.Dense(32, activation="relu"),
        layers.Dense(10),
    ])


def _optimizer(name: str, batch: int):
    import keras

    import fdp_tf

    dp = dict(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1, expected_batch_size=batch)
    if name == "sgd":
        return keras.optimizers.SGD(0.1)
    if name == "exact":
        return fdp_tf.DPSGDVanilla(**dp)
    if name.startswith("jl"):  # "jl10", or "jl10_double_vjp" for a given jvp_method
        r, _, method = name[2:].partition("_")
        return fdp_tf.DPSGDJL(jl_projections=int(r), jvp_method=method or "auto", **dp)
    raise ValueError(f"unknown optimizer {name!r}")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_one(model_name: str, opt_name: str, batch: int) -> dict[str, Any]:
    """Two steps at a fixed batch; the growth of peak RSS over the size before the first."""
    import warnings

    import keras
    import numpy as np

    import fdp_tf

    rng = np.random.default_rng(0)
    x = rng.random((batch, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=batch).astype("int32")
    model = _build(model_name)
    if opt_name == "sgd":
        model.compile(optimizer=_optimizer("sgd", batch), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trained = model
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        trained = fdp_tf.make_private(model, optimizer=_optimizer(opt_name, batch), loss=loss)
    before = _rss_mib()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed batch outside fit is booked at rate 1: memory only here
        for _ in range(2):
            trained.train_on_batch(x, y)
    peak = peak_rss_mib()
    return {"growth_mib": peak - before, "seconds": time.perf_counter() - start,
            "parameters": model.count_params()}


def _measure(model_name: str, opt_name: str, batch: int, timeout: float) -> dict[str, Any]:
    config = json.dumps({"model_name": model_name, "opt_name": opt_name, "batch": batch})
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", config],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        out_of_memory = proc.returncode == -9 or any(
            s in proc.stderr for s in ("MemoryError", "ResourceExhausted", "OOM when allocating"))
        return {"error": f"exit {proc.returncode}: {tail[:160]}", "out_of_memory": out_of_memory}
    return json.loads(lines[-1])


def largest_batch(model_name: str, opt_name: str, *, cap_mib: float, start: int, max_batch: int,
                  resolution: float, timeout: float, log) -> dict[str, Any]:
    """Double from ``start`` until a run exceeds the cap, then bisect to ``resolution``."""
    runs: dict[int, dict[str, Any]] = {}

    def fits(batch: int) -> bool:
        row = _measure(model_name, opt_name, batch, timeout)
        runs[batch] = row
        if "growth_mib" not in row and not row.get("out_of_memory"):  # a bug, not a memory limit
            raise RuntimeError(f"{model_name} {opt_name} at batch {batch}: {row['error']}")
        ok = "growth_mib" in row and row["growth_mib"] <= cap_mib
        shown = f"{row['growth_mib']:.0f} MiB, {row['seconds']:.1f} s" if "growth_mib" in row else row["error"]
        log(f"    {model_name:6s} {_label(opt_name):18s} B={batch:<6d} {shown} -> {'fits' if ok else 'over'}")
        return ok

    good, bad = 0, None
    batch = start
    while True:
        if fits(batch):
            good = batch
            if batch >= max_batch:
                break
            batch = min(2 * batch, max_batch)
        else:
            bad = batch
            break
    while bad is not None and good and bad / good > 1 + resolution:
        middle = int(round((good * bad) ** 0.5))
        if fits(middle):
            good = middle
        else:
            bad = middle
    at_good = runs.get(good, {})
    return {"largest": good, "first_over": bad, "growth_mib": at_good.get("growth_mib"),
            "parameters": next((r["parameters"] for r in runs.values() if "parameters" in r), None),
            "runs": {str(b): r for b, r in sorted(runs.items())}}


def _print_table(results: dict[str, dict[str, dict[str, Any]]], cap_mib: float, max_batch: int) -> None:
    for model_name, rows in results.items():
        params = next((r["parameters"] for r in rows.values() if r.get("parameters")), "?")
        print(f"\n{model_name}: {params:,} parameters; largest batch with peak RSS growth <= {cap_mib:.0f} MiB"
              if isinstance(params, int) else f"\n{model_name}")
        base = rows.get("sgd", {}).get("largest") or None
        seed_base = SEED.get(model_name, {}).get("sgd")
        print("| optimizer | largest batch | × non-DP | growth there (MiB) | first over | seed (P100 16 GB) | seed × non-DP |")
        print("|---|---|---|---|---|---|---|")
        for opt, row in rows.items():
            largest = row["largest"]
            shown = f"{largest:,}" + (" (max)" if largest >= max_batch else "") if largest else "none"
            ratio = f"{largest / base:.3g}" if base and largest else "—"
            growth = f"{row['growth_mib']:.0f}" if row.get("growth_mib") is not None else "—"
            over = f"{row['first_over']:,}" if row.get("first_over") else "—"
            seed = SEED.get(model_name, {}).get(opt)
            seed_ratio = f"{seed / seed_base:.3g}" if seed and seed_base else "—"
            print(f"| {_label(opt)} | {shown} | {ratio} | {growth} | {over} | "
                  f"{f'{seed:,}' if seed else '—'} | {seed_ratio} |")


def _plot(path: str, results: dict[str, dict[str, dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, (model_name, rows) in zip(axes[0], results.items()):
        names = list(rows)
        ours = [rows[n]["largest"] or 0 for n in names]
        seed = [SEED.get(model_name, {}).get(n, 0) for n in names]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], ours, width=0.4, label="this machine (RSS cap)")
        ax.bar([x + 0.2 for x in xs], seed, width=0.4, label="seed (P100 16 GB)", alpha=0.6)
        ax.set_xticks(list(xs), [_label(n) for n in names], rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel("largest batch")
        ax.set_title(model_name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["cnn", "cnn17m"], choices=["cnn", "cnn17m"])
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "jl10", "jl30", "exact"],
                        help="sgd (non-DP), exact (DP-SGD, per-example clipping), jlR (DP-SGD-JL, R projections, "
                             "jvp_method='auto') or jlR_METHOD (that jvp_method, e.g. jl10_double_vjp)")
    parser.add_argument("--cap-mib", type=float, default=4096.0, help="cap on peak RSS growth, MiB (default 4096)")
    parser.add_argument("--start", type=int, default=64, help="first batch tried (default 64)")
    parser.add_argument("--max-batch", type=int, default=MNIST_TRAIN, help="largest batch tried (default 60,000)")
    parser.add_argument("--resolution", type=float, default=0.1,
                        help="bisect until first-over / largest <= 1 + this (default 0.1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (default 900)")
    parser.add_argument("--png", default="", help="write a bar chart here")
    parser.add_argument("--json", default="", help="write the raw results here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: cnn, sgd and jl2, cap 600 MiB, batches 8 to 64")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(**json.loads(args.child))))
        return
    for name in args.optimizers:
        r, _, method = name[2:].partition("_")
        if name not in ("sgd", "exact") and not (name.startswith("jl") and r.isdigit() and method in (
                "", "layerwise", "forward", "double_vjp", "loop")):
            parser.error(f"--optimizers: {name!r} is not sgd, exact, jlR or jlR_METHOD (R projections, "
                         "METHOD a jvp_method: layerwise, forward, double_vjp, loop)")
    if args.quick:
        args.models, args.optimizers, args.cap_mib = ["cnn"], ["sgd", "jl2"], 600.0
        args.start, args.max_batch, args.resolution = 8, 64, 1.0
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"cap {args.cap_mib:.0f} MiB of peak RSS growth", flush=True)
    start = time.perf_counter()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for model_name in args.models:
        results[model_name] = {}
        for opt in args.optimizers:
            results[model_name][opt] = largest_batch(
                model_name, opt, cap_mib=args.cap_mib, start=args.start, max_batch=args.max_batch,
                resolution=args.resolution, timeout=args.timeout, log=lambda s: print(s, flush=True))
    _print_table(results, args.cap_mib, args.max_batch)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.png:
        _plot(args.png, results)


if __name__ == "__main__":
    main()
