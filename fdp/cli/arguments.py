"""From flags to fdp objects, with errors that name the flag."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["FLAGS", "Unreachable", "UsageError", "accountant_of", "describe", "factory", "flag_error",
           "plot_path", "projections_of", "save_plot", "setting_line", "sigma_of", "steps_of"]


class UsageError(Exception):
    """A flag's value is invalid: exit status 2."""


class Unreachable(Exception):
    """The target cannot be met: exit status 1."""



def flag_error(err: ValueError, names: dict[str, str]) -> UsageError:
    """A library ValueError with the Python argument renamed to its flag."""
    message = str(err)
    for name, flag in names.items():
        if message.startswith((name + " ", name + "=")):  # "delta must be ...", "delta=1e-300 is ..."
            return UsageError(flag + message[len(name):])
    return UsageError(message)


def plot_path(path: str | None) -> str | None:
    """--plot's file, refused before any computing where it cannot be written."""
    import os

    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not path or os.path.isdir(path):
        raise UsageError(f"--plot must name a file to write; got {path!r}")
    if not os.path.isdir(folder):
        raise UsageError(f"--plot: no directory {folder!r} to write {os.path.basename(path)!r} in")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--plot: the directory {folder!r} is not writable")
    try:
        from fdp._optional import require

        require("matplotlib", "plot")
    except ImportError as err:
        raise UsageError(f"--plot: {err}") from None
    return path


def save_plot(figure: Any, path: str) -> None:
    """``figure.savefig(path)``, with a failure (a format matplotlib does not know) as a --plot error."""
    try:
        figure.savefig(path, dpi=120)
    except (OSError, ValueError) as err:
        raise UsageError(f"--plot: cannot write {path!r}: {err}") from None


FLAGS = {"noise_multiplier": "--noise-multiplier", "jl_projections": "--jl-projections",
          "sampling_rate": "--sampling-rate", "steps": "--steps", "batch_size": "--batch-size",
          "dataset_size": "--dataset-size", "epochs": "--epochs", "delta": "--delta",
          "epsilon": "--epsilon", "target_epsilon": "--target-epsilon", "fpr": "--fpr", "scale": "--noise-multiplier"}


def steps_of(args: argparse.Namespace, required: bool = True) -> tuple[float, int | None, dict[str, Any]]:
    """(sampling rate, steps or None, a description) from either form of the flags."""
    from fdp import epochs as ep
    from fdp._validation import check_integer, check_sampling_rate
    from fdp.accountant import MAX_STEPS

    by_epochs = [args.batch_size, args.dataset_size]
    if args.sampling_rate is not None:
        if any(v is not None for v in by_epochs) or args.epochs is not None:
            raise UsageError("give either --sampling-rate/--steps or --batch-size/--dataset-size/--epochs, not both")
        p = check_sampling_rate(args.sampling_rate, "--sampling-rate")
        if args.steps is None:
            if required:
                raise UsageError("--steps is required with --sampling-rate")
            return p, None, {"sampling_rate": p}
        t = check_integer("--steps", args.steps, low=1, high=MAX_STEPS)
        return p, t, {"sampling_rate": p, "steps": t}
    if any(v is None for v in by_epochs):
        raise UsageError("give --sampling-rate and --steps, or --batch-size, --dataset-size and --epochs")
    if args.steps is not None:
        raise UsageError("--steps goes with --sampling-rate; with --batch-size/--dataset-size give --epochs")
    p = ep.sampling_rate(args.batch_size, args.dataset_size)
    info = {"sampling_rate": p, "batch_size": args.batch_size, "dataset_size": args.dataset_size,
            "steps_per_epoch": ep.steps_per_epoch(args.batch_size, args.dataset_size)}
    if args.epochs is None:
        if required:
            raise UsageError("--epochs is required with --batch-size and --dataset-size")
        return p, None, info
    t = ep.epochs_to_steps(args.epochs, args.batch_size, args.dataset_size)
    return p, t, {**info, "epochs": args.epochs, "steps": t}


def factory(args: argparse.Namespace, p: float, r: int | None):
    """sigma -> one step of the chosen mechanism at rate p."""
    import fdp

    if args.mechanism == "gaussian":
        if r is not None:
            raise UsageError("--jl-projections is only used with --mechanism jl")
        return lambda s: fdp.Gaussian(noise_multiplier=s, sampling_rate=p)
    if args.mechanism == "laplace":
        if r is not None:
            raise UsageError("--jl-projections is only used with --mechanism jl")
        return lambda s: fdp.Laplace(scale=s, sampling_rate=p)
    return lambda s: fdp.JL(noise_multiplier=s, jl_projections=r, sampling_rate=p)


def sigma_of(args: argparse.Namespace) -> float:
    from fdp._validation import check_real

    if args.noise_multiplier is None:
        raise UsageError("--noise-multiplier is required")
    return check_real("--noise-multiplier", args.noise_multiplier, low=0.0, low_inclusive=False)


def projections_of(args: argparse.Namespace, required: bool = True) -> int | None:
    from fdp._validation import check_integer

    if args.mechanism != "jl":
        return args.jl_projections  # refused by _factory if given
    if args.jl_projections is None:
        if required:
            raise UsageError("--jl-projections is required with --mechanism jl")
        return None
    return check_integer("--jl-projections", args.jl_projections, low=1, high=10**9)


def describe(args: argparse.Namespace, sigma: float | None, r: int | None, info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"mechanism": args.mechanism}
    if sigma is not None:
        out["noise_multiplier"] = sigma
    if r is not None:
        out["jl_projections"] = r
    return {**out, **info}


def setting_line(d: dict[str, Any]) -> str:
    parts = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items()]
    return "  " + ", ".join(parts)


# ------------------------------------------------------------------- commands
def accountant_of(args: argparse.Namespace):
    import fdp

    sigma = sigma_of(args)
    r = projections_of(args)
    check_selected(args)
    if getattr(args, "sampling", "poisson") != "poisson":
        return _fixed_structure(args, sigma, r)
    p, t, info = steps_of(args)
    mech = factory(args, p, r)(sigma)
    return fdp.PLDAccountant().compose(mech, steps=t), describe(args, sigma, r, info)


def check_selected(args: argparse.Namespace) -> None:
    """--selected belongs to --sampling random_allocation."""
    if getattr(args, "selected", 1) != 1 and getattr(args, "sampling", "poisson") != "random_allocation":
        raise UsageError(f"--selected {args.selected} (steps per example per epoch) is for --sampling "
                         "random_allocation; leave it out for the other samplings")


def _fixed_structure(args: argparse.Namespace, sigma: float, r: int | None):
    """--sampling random_allocation or without_replacement, through fdp.dpsgd."""
    import fdp

    scheme = args.sampling
    if scheme == "shuffle":
        raise UsageError("--sampling shuffle has only a lower bound on epsilon: use fdp epsilon (no upper "
                         "bound on epsilon or delta is known for shuffled batches)")
    jl = args.mechanism == "jl" and scheme == "random_allocation"
    if args.mechanism != "gaussian" and not jl:
        allowed = "gaussian and jl" if scheme == "random_allocation" else "gaussian only"
        raise UsageError(f"--sampling {scheme} is accounted for --mechanism {allowed}; got --mechanism {args.mechanism}")
    if args.sampling_rate is not None or args.steps is not None or None in (args.batch_size, args.dataset_size,
                                                                            args.epochs):
        raise UsageError(f"--sampling {scheme} needs --batch-size, --dataset-size and --epochs "
                         "(not --sampling-rate/--steps)")
    names = {"noise_multiplier": "--noise-multiplier", "batch_size": "--batch-size",
             "dataset_size": "--dataset-size", "epochs": "--epochs", "jl_projections": "--jl-projections",
             "selected": "--selected"}
    try:
        acc = fdp.dpsgd(noise_multiplier=sigma, batch_size=args.batch_size, dataset_size=args.dataset_size,
                        epochs=args.epochs, sampling=scheme, jl_projections=r if jl else None,
                        selected=args.selected)
    except ValueError as err:
        raise flag_error(err, names) from None
    (mech, count), = acc.events
    return acc, describe(args, sigma, r, scheme_info(args, mech, count, args.epochs))


def scheme_info(args: argparse.Namespace, mech: Any, count: int, epochs: float) -> dict[str, Any]:
    """What the output says of a --sampling other than poisson: ``count`` events of ``mech``."""
    info: dict[str, Any] = {"sampling": args.sampling, "batch_size": args.batch_size,
                            "dataset_size": args.dataset_size}
    if args.sampling == "random_allocation":  # one event per epoch
        return {**info, "epochs": count, "steps_per_epoch": mech.steps_per_epoch, "selected": mech.selected}
    return {**info, "epochs": epochs, "steps": count, "neighboring": mech.neighboring}


