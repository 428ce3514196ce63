"""``fdp calibrate``: the noise multiplier, the fewest JL projections, or the most epochs."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator

from fdp.cli.arguments import (UsageError, Unreachable, check_selected, describe, factory, projections_of, scheme_info, setting_line,
                               sigma_of, steps_of)

__all__ = ["cmd_calibrate"]

def cmd_calibrate(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from fdp._validation import check_delta, check_real
    from fdp.pld.queries import check_certifiable_delta

    target = check_real("--target-epsilon", args.target_epsilon, low=0.0, low_inclusive=False)
    delta = check_certifiable_delta(check_delta(args.delta, "--delta"))
    check_selected(args)
    if getattr(args, "sampling", "poisson") != "poisson":
        return _calibrate_scheme(args, target, delta)
    p, t, info = steps_of(args, required=False)
    r = projections_of(args, required=False)
    if args.noise_multiplier is None:  # the noise multiplier
        if t is None:
            raise UsageError("give the steps (--steps or --epochs), or --noise-multiplier to calibrate the epochs")
        if args.mechanism == "jl" and r is None:
            raise UsageError("--jl-projections is required to calibrate the noise multiplier of --mechanism jl")
        sigma = _calibrate_sigma(args, target, delta, p, t, r)
        setting = describe(args, sigma, r, info)
        return ({"target_epsilon": target, "delta": delta, **setting},
                f"noise_multiplier={sigma:.6g} meets epsilon <= {target:g} at delta={delta:g} (certified)\n"
                f"{setting_line(setting)}")
    sigma = sigma_of(args)
    if t is None:  # the most steps / epochs
        return _calibrate_steps(args, target, delta, p, sigma, r, info)
    if args.mechanism == "jl" and r is None:  # the fewest projections
        r = _fewest_projections(args, target, delta, p, t, sigma)
        setting = describe(args, sigma, r, info)
        return ({"target_epsilon": target, "delta": delta, **setting},
                f"jl_projections={r} (the fewest) meets epsilon <= {target:g} at delta={delta:g}\n"
                f"{setting_line(setting)}")
    raise UsageError("leave out what to calibrate: --noise-multiplier, --jl-projections (--mechanism jl), "
                     "or the steps (--steps / --epochs)")


@contextlib.contextmanager
def _exit_1_if_unreachable() -> Iterator[None]:
    """A target that cannot be met (the library's ValueError says "unreachable") exits with
    status 1, not 2: the flags were right, the budget is too small."""
    try:
        yield
    except ValueError as err:
        if "unreachable" in str(err):
            raise Unreachable(str(err)) from None
        raise


def _calibrate_sigma(args, target: float, delta: float, p: float, t: int, r: int | None) -> float:
    import fdp

    kind = "gaussian" if args.mechanism == "gaussian" else ("jl" if args.mechanism == "jl" else factory(args, p, r))
    kwargs = dict(sampling_rate=p, jl_projections=r) if isinstance(kind, str) else {}
    if kind == "gaussian":
        kwargs.pop("jl_projections")
    with _exit_1_if_unreachable():
        return fdp.calibrate_noise_multiplier(target_epsilon=target, delta=delta, steps=t, mechanism=kind,
                                              progress=not args.json and sys.stderr.isatty(), **kwargs)


def _fewest_projections(args, target: float, delta: float, p: float, t: int, sigma: float) -> int:
    """Smallest r with certified epsilon <= target (:func:`fdp.fewest_jl_projections`)."""
    import fdp

    def said(r: int, ok: bool) -> None:
        if not args.json:
            print(f"fdp calibrate: r={r} {'meets' if ok else 'misses'} the target", file=sys.stderr)

    with _exit_1_if_unreachable():
        return fdp.fewest_jl_projections(noise_multiplier=sigma, sampling_rate=p, steps=t, target_epsilon=target,
                                         delta=delta, progress=said)


def _calibrate_steps(args, target, delta, p, sigma, r, info) -> tuple[dict[str, Any], str]:
    """The most steps (whole epochs when given B and N) with certified epsilon <= target
    (:func:`fdp.most_steps`)."""
    import fdp

    mech = factory(args, p, r)(sigma)
    unit = info.get("steps_per_epoch", 1)
    name = "epochs" if "steps_per_epoch" in info else "steps"

    with _exit_1_if_unreachable():
        lo = fdp.most_steps(mech, target_epsilon=target, delta=delta, unit=unit)
    setting = describe(args, sigma, r, {**info, name: lo, "steps": lo * unit} if name == "epochs" else
                        {**info, "steps": lo})
    return ({"target_epsilon": target, "delta": delta, **setting},
            f"{lo} {name} (the most) meet epsilon <= {target:g} at delta={delta:g}\n{setting_line(setting)}")




def _calibrate_scheme(args, target: float, delta: float) -> tuple[dict[str, Any], str]:
    """--sampling random_allocation / without_replacement: the noise multiplier (with
    --epochs) or the most whole epochs (with --noise-multiplier), through fdp.dpsgd."""
    import fdp

    scheme = args.sampling
    if scheme == "shuffle":
        raise UsageError("--sampling shuffle has only a lower bound on epsilon, so nothing can be calibrated "
                         "to a target: calibrate --sampling poisson or random_allocation and train that way")
    if args.mechanism != "gaussian" or args.sampling_rate is not None or args.steps is not None or None in (
            args.batch_size, args.dataset_size):
        raise UsageError(f"--sampling {scheme} calibrates --mechanism gaussian from --batch-size and "
                         "--dataset-size (not --sampling-rate/--steps)")
    if (args.noise_multiplier is None) == (args.epochs is None):
        raise UsageError(f"with --sampling {scheme}, give --epochs to calibrate the noise multiplier, or "
                         "--noise-multiplier to calibrate the epochs")

    def run(sigma: float, epochs: float):
        (mech, count), = fdp.dpsgd(noise_multiplier=sigma, batch_size=args.batch_size,
                                   dataset_size=args.dataset_size, epochs=epochs, sampling=scheme,
                                   selected=args.selected).events
        return mech, count

    if args.noise_multiplier is None:
        probe, steps = run(1.0, args.epochs)
        with _exit_1_if_unreachable():
            sigma = fdp.calibrate_noise_multiplier(target_epsilon=target, delta=delta, steps=steps,
                                                   mechanism=lambda s: run(s, args.epochs)[0],
                                                   progress=not args.json and sys.stderr.isatty())
        setting = describe(args, sigma, None, scheme_info(args, probe, steps, args.epochs))
        return ({"target_epsilon": target, "delta": delta, **setting},
                f"noise_multiplier={sigma:.6g} meets epsilon <= {target:g} at delta={delta:g} (certified)\n"
                f"{setting_line(setting)}")
    sigma = sigma_of(args)

    mech, per_epoch = run(sigma, 1)  # one event per epoch (random allocation) or per step
    with _exit_1_if_unreachable():
        lo = fdp.most_steps(mech, target_epsilon=target, delta=delta, unit=per_epoch)
    setting = describe(args, sigma, None, scheme_info(args, *run(sigma, lo), lo))
    return ({"target_epsilon": target, "delta": delta, **setting},
            f"{lo} epochs (the most) meet epsilon <= {target:g} at delta={delta:g}\n{setting_line(setting)}")
