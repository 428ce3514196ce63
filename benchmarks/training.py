"""Seconds per training step: non-DP Adam vs DP-Adam-JL (r = 1, 4, 16) vs exact DP-Adam.

One run, side by side, on two models of the seed (Bu et al., arXiv:2102.03013v1,
Section 4) with random data of the real shapes:

* IMDb: Embedding(8185, 64) -> Bidirectional(LSTM(64)) -> Dense(64, relu) ->
  Dense(2), 150 tokens, 598,274 parameters (``examples/imdb_lstm.py``);
* MNIST: the TF Privacy tutorial CNN, 28x28x1, 26,010 parameters
  (``examples/mnist_cnn.py``).

Every configuration trains through ordinary ``fit`` on ``fdp_tf.poisson_batches``
(the same seed, so every optimizer sees the same batch sizes) and is timed per
step by a callback: the median over ``--steps`` steps after ``--warmup`` steps
(the first includes tracing), or fewer when ``--max-seconds`` is spent. Each
configuration runs in a fresh Python process, so its peak resident memory
(VmHWM: ``ru_maxrss`` would carry the parent's over) is its own; the table shows
the peak and its growth over the resident size just before ``fit`` (model, data and
TensorFlow already loaded).
The non-DP baseline is a plain ``keras.Model`` compiled with
``keras.optimizers.Adam`` (no XLA, like the DP optimizers). TF Privacy's
``DPKerasAdamOptimizer`` is added as a column when ``tensorflow_privacy``
imports (it pins TensorFlow <= 2.15 and Keras 2; see benchmarks/RESULTS.md).

    python benchmarks/training.py [--batch-size 64] [--mnist-batch-size 256]
        [--projections 1 4 16] [--steps 20] [--max-seconds 30] [--png training.png]
        [--json training.json] [--exact-methods vectorized loop] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)

NOISE_MULTIPLIER, L2_NORM_CLIP, LEARNING_RATE = 0.6, 1.0, 1e-3
SEED_GPU_SECONDS_PER_EPOCH = {  # the seed, IMDb, B = 256, P100 (its Table of seconds per epoch)
    "non-DP Adam": 12, "JL r=1": 41, "JL r=5": 128, "JL r=10": 243, "JL r=30": 675,
    "Vanilla (TF Privacy)": 19317,
}


# -- one configuration (runs in a child process unless --in-process) ----------------


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """Peak resident memory of this process image, MiB: Linux's VmHWM, which starts afresh
    at exec. (ru_maxrss carries the forking parent's peak over into the child: under a
    parent larger than the child, step_profile.py --memory read 0 growth for every piece.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _data(model_name: str, n: int, length: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2 if model_name == "imdb" else 10, size=n).astype("int32")
    if model_name == "imdb":
        from imdb_lstm import VOCAB

        x = rng.integers(1, VOCAB, size=(n, length)).astype("int32")
    else:
        x = rng.random((n, 28, 28, 1), dtype=np.float32)
    return x, y


def _build(model_name: str, length: int):
    if model_name == "imdb":
        from imdb_lstm import build_model

        return build_model(length=length)
    from mnist_cnn import build_model

    return build_model()


def _optimizer(name: str):
    import keras

    import fdp_tf

    dp = dict(l2_norm_clip=L2_NORM_CLIP, noise_multiplier=NOISE_MULTIPLIER, learning_rate=LEARNING_RATE)
    if name == "adam":
        return keras.optimizers.Adam(LEARNING_RATE)
    if name == "vanilla":
        return fdp_tf.DPAdamVanilla(**dp)
    if name.startswith("vanilla_"):
        return fdp_tf.DPAdamVanilla(per_example_method=name.split("_")[1], **dp)
    if name.startswith("jl"):  # "jl4", or "jl4_double_vjp" for a given jvp_method
        r, _, method = name[2:].partition("_")
        return fdp_tf.DPAdamJL(jl_projections=int(r), jvp_method=method or "auto", **dp)
    raise ValueError(f"unknown optimizer {name!r}")


def run_config(model_name: str, opt_name: str, *, batch: int, steps: int, warmup: int,
               max_seconds: float, length: int) -> dict[str, Any]:
    """Train one configuration for warmup + steps steps and time each step."""
    import warnings

    import keras

    import fdp_tf

    keras.utils.set_random_seed(0)
    n = 16 * batch  # the cost of a step does not depend on N; p = 1/16
    x, y = _data(model_name, n, length)
    model = _build(model_name, length)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    total = warmup + steps
    method = ""
    times: list[float] = []
    sizes: list[int] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            if logs and "loss" in logs:
                float(keras.ops.convert_to_numpy(logs["loss"]))  # the step has finished
            times.append(time.perf_counter() - self.start)
            measured = times[warmup:]
            if len(measured) >= 3 and sum(measured) > max_seconds:
                self.model.stop_training = True

    if opt_name == "tfp":
        import tensorflow_privacy  # noqa: F401  (ImportError: reported as "not installed")

        optimizer = tensorflow_privacy.DPKerasAdamOptimizer(
            l2_norm_clip=L2_NORM_CLIP, noise_multiplier=NOISE_MULTIPLIER,
            num_microbatches=batch, learning_rate=LEARNING_RATE,
        )
        model.compile(optimizer=optimizer, loss=loss)
        rss_before = _rss_mib()
        model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=total, verbose=0,
                  callbacks=[StepTimer()])
        sizes = [batch] * len(times)
    else:
        if opt_name == "adam":
            model.compile(optimizer=_optimizer("adam"), loss=loss, jit_compile=False)
            trained = model  # a plain keras.Model: the baseline users compare with
        else:
            optimizer = _optimizer(opt_name)
            trained = fdp_tf.make_private(model, optimizer=optimizer, loss=loss)
            method = _resolved_method(optimizer, trained)
        def batches():
            return fdp_tf.poisson_batches(x, y, expected_batch_size=batch, steps_per_epoch=total, seed=0)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
            # seed=0 (not private, warned): every column trains on the same batch sizes.
            warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
            # A new dataset with the same seed draws the same first epoch: the sizes fit will see.
            sizes = [int(b[1].shape[0]) for b in batches()]
            data = batches()
            rss_before = _rss_mib()
            trained.fit(data, epochs=1, verbose=0, shuffle=False, callbacks=[StepTimer()])
    measured = times[warmup:]
    return {
        "model": model_name, "optimizer": opt_name, "batch": batch, "method": method,
        "seconds_per_step": statistics.median(measured),
        "q25": _quantile(measured, 0.25), "q75": _quantile(measured, 0.75),
        "first_step": times[0], "steps_measured": len(measured),
        "mean_batch": statistics.mean(sizes[warmup:len(times)]),
        "rss_before_mib": rss_before, "peak_rss_mib": peak_rss_mib(),
    }


def _resolved_method(optimizer: Any, model: Any) -> str:
    """What ``"auto"`` picks inside ``fit`` (graph mode, where nested accumulators work)."""
    import tensorflow as tf

    picked: list[str] = []

    @tf.function
    def probe() -> Any:
        if hasattr(optimizer, "resolve_jvp_method"):
            picked.append(optimizer.resolve_jvp_method(model))
        else:
            picked.append(optimizer.resolve_per_example_method(model))
        return tf.constant(0)

    probe()
    return picked[0]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# -- the driver -------------------------------------------------------------------------


def _tfp_status() -> str:
    try:
        import tensorflow_privacy  # noqa: F401
    except Exception as err:  # ImportError, or its own errors under Keras 3
        return f"not importable ({type(err).__name__}: {str(err).splitlines()[0][:80]})"
    return "ok"


def _run_child(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(config)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def _label(opt: str) -> str:
    if opt == "adam":
        return "non-DP Adam"
    if opt == "vanilla":
        return "DPAdamVanilla (exact)"
    if opt.startswith("vanilla_"):
        return f"DPAdamVanilla (exact, {opt.split('_')[1]})"
    if opt == "tfp":
        return "TF Privacy DPKerasAdam"
    r, _, method = opt[2:].partition("_")
    return f"DPAdamJL r={r}" + (f" ({method})" if method else "")


def _print_table(model_name: str, batch: int, rows: dict[str, dict[str, Any]]) -> None:
    base = rows.get("adam", {}).get("seconds_per_step")
    exact = [r["seconds_per_step"] for o, r in rows.items() if o.startswith("vanilla") and "seconds_per_step" in r]
    vanilla = min(exact) if exact else None
    print(f"\n{model_name}, expected batch {batch}")
    print("| optimizer | method | s/step (median) | IQR | first step s | × non-DP | speed-up vs fastest exact "
          "| peak RSS MiB | RSS growth MiB | steps | mean batch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for opt, row in rows.items():
        if "error" in row:
            print(f"| {_label(opt)} | | — | | | | | | | | {row['error']} |")
            continue
        t = row["seconds_per_step"]
        ratio = f"{t / base:.1f}×" if base else "—"
        speedup = f"{vanilla / t:.1f}×" if vanilla else "—"
        if row.get("isolated", True):
            memory = f"{row['peak_rss_mib']:.0f} | {row['peak_rss_mib'] - row['rss_before_mib']:.0f}"
        else:
            memory = "— | —"  # one process for all configurations: its peak is not this row's
        print(f"| {_label(opt)} | {row.get('method') or '—'} | {t:.4f} | {row['q25']:.4f}–{row['q75']:.4f} | {row['first_step']:.1f} "
              f"| {ratio} | {speedup} | {memory} | {row['steps_measured']} | {row['mean_batch']:.1f} |")


def _plot(path: str, results: dict[str, dict[str, dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(results)
    opts = [o for o in dict.fromkeys(o for m in models for o in results[m])
            if any("seconds_per_step" in results[m].get(o, {}) for m in models)]
    x = np.arange(len(models))
    width = 0.8 / max(len(opts), 1)
    fig, ax = plt.subplots(figsize=(9.5, 3.8))
    for i, opt in enumerate(opts):
        values = [results[m].get(opt, {}).get("seconds_per_step", np.nan) for m in models]
        bars = ax.bar(x + (i - (len(opts) - 1) / 2) * width, values, width, label=_label(opt))
        base = [results[m].get("adam", {}).get("seconds_per_step") for m in models]
        for bar, v, b in zip(bars, values, base):
            if b and np.isfinite(v):
                ax.annotate(f"{v / b:.0f}×" if v / b >= 10 else f"{v / b:.1f}×",
                            (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, models)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per step (median; label: × non-DP)")
    ax.set_ylim(top=ax.get_ylim()[1] * 2)  # room for the labels
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["imdb", "mnist"], choices=["imdb", "mnist"])
    parser.add_argument("--batch-size", type=int, default=64, help="IMDb expected batch (seed: 256)")
    parser.add_argument("--mnist-batch-size", type=int, default=256)
    parser.add_argument("--length", type=int, default=150, help="IMDb tokens per review")
    parser.add_argument("--projections", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (the first traces)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="stop timing a configuration after this many seconds (>= 3 steps)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per configuration")
    parser.add_argument("--in-process", action="store_true",
                        help="run every configuration in this process (memory column meaningless)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 10 tokens, batches 4 / 8, 2 steps, r = 1 and 2, in-process")
    parser.add_argument("--exact-methods", nargs="*", default=None,
                        choices=["layerwise", "vectorized", "loop"],
                        help="exact DP-Adam columns besides per_example_method='auto' (default: "
                             "vectorized, the pfor approach of TF Privacy; --quick: loop)")
    parser.add_argument("--jvp-methods", nargs="*", default=[],
                        choices=["layerwise", "forward", "double_vjp", "loop"],
                        help="DP-Adam-JL columns with these jvp_methods besides 'auto' (every r)")
    parser.add_argument("--png", default="")
    parser.add_argument("--json", default="", help="write the raw results here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_config(**json.loads(args.child))))
        return
    if args.quick:
        args.batch_size, args.mnist_batch_size, args.length = 4, 8, 10
        args.projections, args.steps, args.warmup, args.in_process = [1, 2], 2, 1, True
    if args.exact_methods is None:
        args.exact_methods = ["loop"] if args.quick else ["vectorized"]

    load_before = os.getloadavg()
    tfp = _tfp_status()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import keras
    import tensorflow as tf

    print(f"machine: {cpu}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"tensorflow {tf.__version__}, keras {keras.__version__}; load average {load_before[0]:.2f}")
    print(f"tensorflow_privacy: {tfp}")
    opts = ["adam", *[f"jl{r}" for r in args.projections], "vanilla"] + (["tfp"] if tfp == "ok" else [])
    results: dict[str, dict[str, dict[str, Any]]] = {}
    start = time.perf_counter()
    for model_name in args.models:
        batch = args.batch_size if model_name == "imdb" else args.mnist_batch_size
        results[model_name] = {}
        # "auto" picks layerwise for both models; time the other exact methods beside it.
        extra = [f"vanilla_{m}" for m in args.exact_methods]
        extra += [f"jl{r}_{m}" for m in args.jvp_methods for r in args.projections]
        for opt in [*opts, *extra]:
            config = dict(model_name=model_name, opt_name=opt, batch=batch, steps=args.steps,
                          warmup=args.warmup, max_seconds=args.max_seconds, length=args.length)
            if args.in_process:
                try:
                    row = dict(run_config(**config), isolated=False)
                except Exception as err:  # noqa: BLE001 - a failed column is reported, not fatal
                    row = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
            else:
                row = _run_child(config, args.timeout)
            results[model_name][opt] = row
            shown = f"{row['seconds_per_step']:.4f} s/step" if "seconds_per_step" in row else row["error"]
            print(f"  {model_name:5s} {_label(opt):24s} {shown}", flush=True)
        _print_table(model_name, batch, results[model_name])
    load_after = os.getloadavg()
    print(f"\ntotal {time.perf_counter() - start:.0f} s; load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f} (1 min)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "load": [load_before, load_after], "tfp": tfp}, f, indent=1)
    if args.png:
        _plot(args.png, results)


if __name__ == "__main__":
    main()
