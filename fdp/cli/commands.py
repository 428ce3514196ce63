"""``fdp epsilon``, ``delta``, ``curves`` and ``risk``."""

from __future__ import annotations

import argparse
import math
from typing import Any

from fdp.cli.arguments import (FLAGS, UsageError, accountant_of, check_selected, flag_error, plot_path, save_plot, setting_line,
                               sigma_of)

__all__ = ["cmd_curves", "cmd_delta", "cmd_epsilon", "cmd_risk", "cmd_warmup"]


def cmd_epsilon(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from fdp._validation import check_delta

    delta = check_delta(args.delta, "--delta")
    check_selected(args)
    if args.sampling == "shuffle":
        return _shuffled(args, delta)
    acc, setting = accountant_of(args)
    lo, hi = acc.get_epsilon_bounds(delta)
    text = (f"epsilon in [{lo:.6g}, {hi:.6g}] at delta={delta:g} (certified lower and upper bounds; "
            f"report the upper)\n{setting_line(setting)}")
    return {"lower": lo, "upper": hi, "delta": delta, **setting}, text


def _shuffled(args: argparse.Namespace, delta: float) -> tuple[dict[str, Any], str]:
    """--sampling shuffle: the certified lower bound only (fdp.shuffled_lower_bound)."""
    import fdp

    if args.mechanism != "gaussian" or args.sampling_rate is not None or args.steps is not None or None in (
            args.batch_size, args.dataset_size, args.epochs):
        raise UsageError("--sampling shuffle needs --mechanism gaussian with --batch-size, --dataset-size and "
                         "--epochs (not --sampling-rate/--steps)")
    sigma = sigma_of(args)
    # a lower bound counts only the whole epochs run (a partial one can only add to it)
    epochs = math.floor(args.epochs) if isinstance(args.epochs, float) and math.isfinite(args.epochs) else args.epochs
    names = {"noise_multiplier": "--noise-multiplier", "batch_size": "--batch-size",
             "dataset_size": "--dataset-size", "epochs": "--epochs"}
    try:
        lower = fdp.shuffled_lower_bound(sigma, args.batch_size, args.dataset_size, epochs, delta)
    except ValueError as err:
        raise flag_error(err, names) from None
    setting = {"mechanism": "gaussian", "noise_multiplier": sigma, "sampling": "shuffle",
               "batch_size": args.batch_size, "dataset_size": args.dataset_size, "epochs": epochs}
    text = (f"epsilon >= {lower:.6g} at delta={delta:g} (a certified LOWER bound: shuffled batches have no "
            "known upper bound; train on Poisson or random-allocation batches to certify one)\n"
            f"{setting_line(setting)}")
    return {"lower": lower, "upper": None, "delta": delta, **setting}, text


def cmd_delta(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from fdp._validation import check_real

    eps = check_real("--epsilon", args.epsilon, low=0.0)
    acc, setting = accountant_of(args)
    lo, hi = acc.get_delta_bounds(eps)
    text = f"delta in [{lo:.6g}, {hi:.6g}] at epsilon={eps:g} (certified)\n{setting_line(setting)}"
    return {"lower": lo, "upper": hi, "epsilon": eps, **setting}, text


def cmd_curves(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    import fdp
    from fdp._validation import check_delta, check_integer

    delta = check_delta(args.delta, "--delta")
    sigma = sigma_of(args)
    plot = plot_path(args.plot)
    if args.batch_size is None or args.dataset_size is None or args.epochs is None or args.sampling_rate is not None:
        raise UsageError("curves needs --batch-size, --dataset-size and --epochs (a table per epoch)")
    epochs = check_integer("--epochs", args.epochs, low=1, high=10_000)
    rs = [check_integer("--jl-projections", r, low=1, high=10**9) for r in args.jl_projections]
    p = fdp.epochs.sampling_rate(args.batch_size, args.dataset_size)
    per_epoch = fdp.steps_per_epoch(args.batch_size, args.dataset_size)
    steps = [e * per_epoch for e in range(1, epochs + 1)]
    mechs = {f"JL(r={r})": (fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p), steps) for r in rs}
    schemes = args.sampling or ["poisson"]
    if "poisson" in schemes:
        name = "Gaussian" if schemes == ["poisson"] else "Gaussian, Poisson"
        mechs[name] = (fdp.Gaussian(noise_multiplier=sigma, sampling_rate=p), steps)
    if "random_allocation" in schemes:  # one composed step per epoch
        try:
            epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=sigma), steps_per_epoch=per_epoch)
        except ValueError as err:
            raise flag_error(err, FLAGS) from None
        mechs["Gaussian, random allocation"] = (epoch, list(range(1, epochs + 1)))
    if "without_replacement" in schemes:  # epsilon for replacing one example (fdp.dpsgd's sigma / 2)
        step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=sigma / 2), sample_size=args.batch_size,
                                             dataset_size=args.dataset_size)
        mechs["Gaussian, without replacement (replace-one)"] = (step, steps)
    tqdm = _tqdm()
    with tqdm(total=len(mechs) * epochs, desc="fdp curves", unit="point", disable=args.json or None) as bar:
        curves = {name: fdp.epsilon_curve(m, at, delta, progress=bar.update) for name, (m, at) in mechs.items()}
    head = "| epoch | " + " | ".join(curves) + " |"
    lines = [f"epsilon bounds [lower, upper] at delta={delta:g}, noise_multiplier={sigma:g}, "
             f"p={p:.6g}, {per_epoch} steps/epoch", head, "|---:|" + "---:|" * len(curves)]
    for i in range(epochs):
        lines.append(f"| {i + 1} | " + " | ".join(f"[{c[i][0]:.4g}, {c[i][1]:.4g}]" for c in curves.values()) + " |")
    if plot:
        _plot_curves(plot, curves, delta, sigma)
        lines.append(f"wrote {plot}")
    data = {"delta": delta, "noise_multiplier": sigma, "sampling_rate": p, "steps_per_epoch": per_epoch,
            "epochs": list(range(1, epochs + 1)),
            "curves": {n: {"lower": [lo for lo, _ in c], "upper": [hi for _, hi in c]} for n, c in curves.items()}}
    return data, "\n".join(lines)


def cmd_risk(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    import fdp
    from fdp.risk import DEFAULT_FPR

    acc, setting = accountant_of(args)
    plot = plot_path(args.plot)
    try:
        risk = fdp.attack_risk(acc, fpr=DEFAULT_FPR if args.fpr is None else args.fpr)
    except ValueError as err:
        raise flag_error(err, FLAGS) from None
    lines = ["membership inference: the best attack's true-positive rate at each false-positive rate",
             "(certified: no attack does better than the upper column; one attack reaches the lower)",
             f"{'FPR':>10} {'TPR lower':>11} {'TPR upper':>11}"]
    lines += [f"{a:>10.3g} {lo:>11.4g} {hi:>11.4g}" for a, lo, hi in zip(risk.fpr, risk.tpr_lower, risk.tpr_upper)]
    lines.append(f"advantage max(TPR - FPR) in [{risk.advantage[0]:.4g}, {risk.advantage[1]:.4g}]")
    lines.append(setting_line(setting))
    if plot:
        import matplotlib
        import numpy as np

        matplotlib.use("Agg")
        dense = fdp.attack_risk(acc, fpr=np.unique(np.concatenate([np.logspace(-6, 0, 61), risk.fpr])))
        ax = dense.plot()
        ax.plot(risk.fpr, risk.tpr_upper, "s", color="C3", label="the FPRs asked for")
        ax.legend(fontsize=8)
        save_plot(ax.figure, plot)
        lines.append(f"wrote {plot}")
    return {**risk.to_dict(), **setting}, "\n".join(lines)


def _tqdm():
    from tqdm import tqdm  # a dependency of fdp

    return tqdm


def _plot_curves(path: str, curves: dict[str, list[tuple[float, float]]], delta: float, sigma: float) -> None:
    from fdp._optional import require

    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, c in curves.items():
        epochs = range(1, len(c) + 1)
        lo, hi = [v[0] for v in c], [v[1] if math.isfinite(v[1]) else v[0] for v in c]
        line, = ax.plot(epochs, hi, label=name)
        ax.fill_between(epochs, lo, hi, color=line.get_color(), alpha=0.25)
    ax.set_yscale("log")
    ax.set_xlabel("epochs")
    ax.set_ylabel(f"epsilon (delta = {delta:g})")
    ax.set_title(f"certified epsilon bounds, noise multiplier {sigma:g}")
    ax.legend()
    fig.tight_layout()
    save_plot(fig, path)


def cmd_warmup(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Compile (and cache on disk) every Numba kernel a query uses, once after installing:
    later processes load them instead of compiling (seconds saved on the first query)."""
    import time

    import fdp

    # the JL query first: it hands the accountant's kernels to a helper process while it
    # compiles the JL mechanism's (where a core is spare; fdp._kernels.prefetch)
    stages = [
        ("JL mechanism", lambda: fdp.dpsgd(noise_multiplier=1.0, batch_size=10, dataset_size=1000, epochs=1,
                                           jl_projections=10).get_epsilon_bounds(1e-5)),
        ("Gaussian accountant", lambda: fdp.dpsgd(noise_multiplier=1.0, batch_size=10, dataset_size=1000,
                                                  epochs=1).get_epsilon_bounds(1e-5)),
        ("tradeoff curves and attack risk", lambda: fdp.attack_risk(
            fdp.dpsgd(noise_multiplier=1.0, batch_size=10, dataset_size=1000, epochs=1), fpr=[0.01])),
    ]
    tqdm = _tqdm()
    times = {}
    with tqdm(stages, desc="fdp warmup", unit="stage", disable=args.json or None) as bar:
        for name, run in bar:
            bar.set_postfix_str(name)
            start = time.perf_counter()
            run()
            times[name] = time.perf_counter() - start
    lines = ["| compiled and cached | seconds |", "|---|---:|"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in times.items()]
    return {"seconds": times}, "\n".join(lines)
