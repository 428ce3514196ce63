"""Where the memory of a private model's first training step goes: trace, first call, probe.

Each configuration runs in a fresh Python process, on the IMDb BiLSTM of the seed
(``examples/imdb_lstm.py``) with random tokens. The model's ``train_step`` is traced in a
``tf.function`` of its own, then called three times on the same batch; before each phase the
kernel's peak-RSS mark is reset (``/proc/self/clear_refs``), so every phase gets its own peak
above the resident size it started from:

* **trace**: ``get_concrete_function`` (the graph of the step and of every check and
  alternative it carries), with the final graph's size: nodes (the function library's
  included), functions, serialised MiB;
* **first call**: the runtime instantiates the graph's functions and runs the step, whose
  first call also runs the run-time probe of :mod:`fdp_tf.verify`;
* **first call, probe skipped**: the same with the trace's verification flag set before the
  call (``--skip-probe``, its own process): the difference is the probe's share;
* **second call** (the steady step).

``--python-heap`` also reports what ``tracemalloc`` sees of the trace (Python objects only).
``--without rerun`` / ``--without probe`` (measurement only, never a way to train) trace the
step without the rerun that drops non-finite rows (:mod:`fdp_tf.nonfinite`) or without the
first step's probe, to show what each adds to the graph and its memory.

    python benchmarks/first_step_memory.py [--batch-size 64] [--configs nondp jl1_forward jl1 vanilla]
        [--skip-probe] [--python-heap] [--without rerun probe] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.dirname(HERE))

CONFIGS = {
    "nondp": "non-DP Adam",
    "jl1_forward": "DP-Adam-JL r=1, jvp_method='forward'",
    "jl1": "DP-Adam-JL r=1, auto (layer taps)",
    "jl10_forward": "DP-Adam-JL r=10, jvp_method='forward'",
    "vanilla": "exact DP-Adam, auto (layer taps)",
}


def _memory() -> tuple[float, float]:
    """(resident, peak resident since the last reset), MiB."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line[:5]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


def _reset_peak() -> float:
    """Collect garbage, reset the kernel's peak-RSS mark; the resident size now, MiB. Where the
    mark cannot be reset (not Linux >= 4.0, a sandboxed /proc), a phase's peak is the process's
    since it started, and the table says so."""
    global PEAK_RESETS
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as refs:  # "5": reset the peak RSS mark
            refs.write("5")
    except OSError:
        PEAK_RESETS = False
    return _memory()[0]


PEAK_RESETS = True


def _peak_above(start: float, end: float, peak: float) -> float:
    """A phase's peak above its start, MiB. The kernel's counters lag by up to a few hundred
    KiB per thread, so the mark can read below the start or the end (CI read -0.27 MiB): a
    phase's peak is at least both."""
    return max(peak, start, end) - start


def _strip(parts: list[str]) -> None:
    """Trace the step without ``parts`` of its checks (a measurement of their share only)."""
    import fdp_tf.verify as verify

    if "rerun" in parts:
        verify.without_nonfinite_examples = lambda result, rerun, alone=None: result
    if "probe" in parts:
        verify._cond = lambda pred, true_fn, false_fn: false_fn()


def measure(config: str, batch: int, length: int, skip_probe: bool, python_heap: bool,
            without: list[str] | None = None) -> dict[str, Any]:
    """One configuration's phases, in this process (the parent runs each in a fresh one)."""
    import warnings

    import keras
    import numpy as np
    import tensorflow as tf

    import fdp_tf
    from fdp_tf.verify import step_checks
    from imdb_lstm import VOCAB, build_model

    warnings.simplefilter("ignore")
    _strip(without or [])
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(1, VOCAB, size=(batch, length)), tf.int32)
    y = tf.constant(rng.integers(0, 2, size=batch), tf.int32)
    model = build_model(length=length)
    model(x[:1])
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    if config == "nondp":
        trained = model
        trained.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    else:
        dp = dict(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=batch)
        if config.startswith("jl"):
            r, _, method = config[2:].partition("_")
            optimizer = fdp_tf.DPAdamJL(jl_projections=int(r), jvp_method=method or "auto", **dp)
        else:
            optimizer = fdp_tf.DPAdamVanilla(**dp)
        trained = fdp_tf.PrivateModel(model)
        trained.compile(optimizer=optimizer, loss=per_example)
    trained.optimizer.build(model.trainable_variables)
    step = tf.function(lambda x, y: trained.train_step((x, y)))
    out: dict[str, Any] = {"config": config, "batch": batch, "length": length}

    if python_heap:
        import tracemalloc

        tracemalloc.start(1)
    start, began = _reset_peak(), time.perf_counter()
    traced = step.get_concrete_function(x, y)
    rss, peak = _memory()
    out["trace"] = {"seconds": time.perf_counter() - began, "growth_mib": rss - start,
                    "peak_mib": _peak_above(start, rss, peak)}
    if python_heap:
        current, heap_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["trace"]["python_heap_mib"] = current / 2**20
        out["trace"]["python_heap_peak_mib"] = heap_peak / 2**20
    graph = traced.graph.as_graph_def()
    out["graph"] = {"nodes": len(graph.node) + sum(len(fn.node_def) for fn in graph.library.function),
                    "functions": len(graph.library.function), "serialised_mib": graph.ByteSize() / 2**20}
    del graph
    if skip_probe and config != "nondp":
        checks = step_checks(trained.optimizer)
        checks.verified.assign(tf.ones_like(checks.verified))  # every trace counts as verified
    for phase in ("first call", "second call", "third call"):
        start, began = _reset_peak(), time.perf_counter()
        traced(x, y)
        rss, peak = _memory()
        out[phase] = {"seconds": time.perf_counter() - began, "growth_mib": rss - start,
                      "peak_mib": _peak_above(start, rss, peak)}
    out["peaks_per_phase"] = PEAK_RESETS
    return out


def _child(config: str, args: argparse.Namespace, skip_probe: bool) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", config, "--batch-size", str(args.batch_size),
               "--length", str(args.length)]
    command += ["--skip-probe"] if skip_probe else []
    command += ["--python-heap"] if args.python_heap else []
    command += ["--without", *args.without] if args.without else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        return {"config": config, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print(rows: list[dict[str, Any]]) -> None:
    print("| configuration | trace: MiB kept / peak (s) | graph: nodes, functions | first call: kept / peak "
          "| second call: peak | third call: peak | all three: kept |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        name = CONFIGS[row["config"]] + (", probe skipped" if row.get("skip_probe") else "")
        name += "".join(f", without the {part}" for part in row.get("without", []))
        if "error" in row:
            print(f"| {name} | failed: {row['error']} | | | | | |")
            continue
        trace, first = row["trace"], row["first call"]
        heap = f", Python heap {trace['python_heap_mib']:.0f}" if "python_heap_mib" in trace else ""
        kept = trace["growth_mib"] + first["growth_mib"] + row["second call"]["growth_mib"] + row["third call"]["growth_mib"]
        print(f"| {name} | {trace['growth_mib']:.0f} / {trace['peak_mib']:.0f} ({trace['seconds']:.1f}{heap}) "
              f"| {row['graph']['nodes']:,}, {row['graph']['functions']} "
              f"| {first['growth_mib']:.0f} / {first['peak_mib']:.0f} | {row['second call']['peak_mib']:.0f} "
              f"| {row['third call']['peak_mib']:.0f} | {kept:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["nondp", "jl1_forward", "jl1", "vanilla"], choices=list(CONFIGS))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=150, help="tokens per review")
    parser.add_argument("--skip-probe", action="store_true", help="also run each private configuration without the probe")
    parser.add_argument("--python-heap", action="store_true", help="tracemalloc over the trace (slows it)")
    parser.add_argument("--without", nargs="+", default=[], choices=["rerun", "probe"],
                        help="trace the private step without these checks (their share; not private)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    parser.add_argument("--json", default="", help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="B = 4, 6 tokens, non-DP and JL(1) forward")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.length < 1:
        parser.error(f"--batch-size and --length must be >= 1, got {args.batch_size} and {args.length}")
    if args.child:
        row = measure(args.child, args.batch_size, args.length, args.skip_probe, args.python_heap, args.without)
        row["skip_probe"] = args.skip_probe
        row["without"] = args.without
        print(json.dumps(row))
        return 0
    if args.quick:
        args.batch_size, args.length, args.configs = 4, 6, ["nondp", "jl1_forward"]
        args.skip_probe = True

    from tqdm import tqdm

    private = [c for c in args.configs if c != "nondp"]
    jobs = [(c, False) for c in args.configs if not (args.without and c == "nondp")]
    jobs += [(c, True) for c in private if args.skip_probe]
    rows = []
    for config, skip in tqdm(jobs, desc="first_step_memory", unit="process", file=sys.stderr):
        row = _child(config, args, skip)
        row["skip_probe"] = skip
        rows.append(row)
    print(f"IMDb BiLSTM, B = {args.batch_size}, {args.length} tokens; MiB of resident memory above the phase's "
          "start (kept: at its end; peak: the highest during it)")
    _print(rows)
    if not all(row.get("peaks_per_phase", True) for row in rows):
        print("(the peak-RSS mark could not be reset here: a phase's peak is the process's since it started)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
