"""The argument parser of ``fdp``: subcommands and their flags."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

__all__ = ["MECHANISMS", "build_parser"]

MECHANISMS = ("gaussian", "laplace", "jl")

#: Flags people type from other tools, and the flag meant.
ALIASES = {"--sigma": ("--noise-multiplier",), "--noise": ("--noise-multiplier",),
           "--eps": ("--epsilon", "--target-epsilon"), "--target-eps": ("--target-epsilon",),
           "--q": ("--sampling-rate",), "--rate": ("--sampling-rate",), "--batch": ("--batch-size",),
           "--n": ("--dataset-size",), "--num-examples": ("--dataset-size",), "--r": ("--jl-projections",),
           "--projections": ("--jl-projections",)}


class _Parser(argparse.ArgumentParser):
    """One-line errors; the top-level parser also knows its subcommands' parsers (``commands``)."""

    def error(self, message: str) -> NoReturn:  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Unknown flags are named first (before a missing required flag), each with the
        subcommand's flag it was probably meant as."""
        argv = sys.argv[1:] if args is None else [str(a) for a in args]
        commands: dict[str, argparse.ArgumentParser] = getattr(self, "commands", {})
        command = commands.get(next((a for a in argv if not a.startswith("-")), ""))
        if command is not None:
            known = [flag for action in command._actions for flag in action.option_strings]
            flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
            unknown = [f for f in flags if not any(k.startswith(f) for k in known)]  # prefixes are argparse's
            if unknown:
                hints = [f"{f}: did you mean {guess}?" for f in unknown if (guess := _meant(f, known))]
                command.error(f"unrecognized arguments: {' '.join(unknown)}"
                              + (f" ({'; '.join(hints)})" if hints else ""))
        return super().parse_args(args, namespace)


def _meant(flag: str, known: list[str]) -> str | None:
    """The known flag ``flag`` was probably meant as: an alias (:data:`ALIASES`), else the
    closest spelling, else None."""
    alias = next((meant for meant in ALIASES.get(flag, ()) if meant in known), None)
    return alias or next(iter(difflib.get_close_matches(flag, known, n=1, cutoff=0.6)), None)


def _numbers(text: str, kind: type, what: str) -> list:
    """Comma-separated numbers; an empty item ("0.1,,0.2", "0.1,") is a typo, not a skip."""
    try:
        values = [kind(v) for v in text.split(",")]  # int(" 3 ") and float(" 3 ") strip
    except ValueError:
        values = []
    if not values:  # "" would ask for nothing: an empty table, exit 0
        raise argparse.ArgumentTypeError(f"expected comma-separated {what} with no empty items; got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    return _numbers(text, float, "numbers")


def _ints(text: str) -> list[int]:
    return _numbers(text, int, "integers")


def build_parser() -> _Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--mechanism", choices=MECHANISMS, default="gaussian",
                        help="one step: Poisson-subsampled Gaussian, Laplace, or DP-SGD-JL's JL mechanism")
    common.add_argument("--noise-multiplier", type=float,
                        help="sigma (noise std / clipping norm); the Laplace scale b for --mechanism laplace")
    common.add_argument("--sampling-rate", type=float, help="Poisson rate p in (0, 1] (with --steps)")
    common.add_argument("--steps", type=int, help="number of steps T (with --sampling-rate)")
    common.add_argument("--batch-size", type=int, help="expected batch size B (with --dataset-size, --epochs)")
    common.add_argument("--dataset-size", type=int, help="number of training examples N")
    common.add_argument("--epochs", type=float, help="epochs E; ceil(E * ceil(N/B)) steps")
    common.add_argument("--json", action="store_true", help="print one JSON object")
    jl = argparse.ArgumentParser(add_help=False)
    jl.add_argument("--jl-projections", type=int, help="r, the JL projections (--mechanism jl)")

    parser = _Parser(prog="fdp", description="Certified privacy accounting for DP-SGD and DP-SGD-JL",
                     epilog="Every bound printed is certified (docs/accountant.md).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sampling = argparse.ArgumentParser(add_help=False)
    sampling.add_argument("--sampling", choices=("poisson", "random_allocation", "without_replacement", "shuffle"),
                          default="poisson",
                          help="how batches are drawn: poisson (each example kept with probability B/N at "
                               "every step), random_allocation (each example in exactly one of the "
                               "ceil(N/B) steps of every epoch), without_replacement (exactly B examples "
                               "per step; epsilon for replacing one example) or shuffle (a permutation per "
                               "epoch cut into batches of B; epsilon only: a certified LOWER bound, no upper "
                               "bound is known); all but poisson with --batch-size, --dataset-size, --epochs "
                               "(default: %(default)s)")
    sampling.add_argument("--selected", type=int, default=1, metavar="K",
                          help="with --sampling random_allocation: the steps each example is used in per "
                               "epoch; an epoch is then ceil(N K / B) steps (K > 1: --mechanism gaussian) "
                               "(default: %(default)s)")
    delta_help = "delta in (0, 1), e.g. 1e-5 (at most 1 / N is usual)"
    p = sub.add_parser("epsilon", parents=[common, jl, sampling], help="certified bounds on epsilon at --delta")
    p.add_argument("--delta", type=float, required=True, help=delta_help)
    p = sub.add_parser("delta", parents=[common, jl, sampling], help="certified bounds on delta at --epsilon")
    p.add_argument("--epsilon", type=float, required=True, help="epsilon >= 0")
    p = sub.add_parser("calibrate", parents=[common, jl, sampling],
                       help="the noise multiplier (or the fewest JL projections, or the most epochs) "
                            "meeting --target-epsilon",
                       description="Find what meets --target-epsilon at --delta: leave out what to find. "
                                   "No --noise-multiplier (with the steps): the smallest noise multiplier. "
                                   "--noise-multiplier and no --epochs/--steps: the most epochs (steps). "
                                   "--noise-multiplier, the steps, --mechanism jl and no --jl-projections: "
                                   "the fewest projections r.")
    p.add_argument("--target-epsilon", type=float, required=True, help="the epsilon budget, > 0")
    p.add_argument("--delta", type=float, required=True, help=delta_help)
    p = sub.add_parser("curves", parents=[common], help="epsilon after each epoch, for several r and samplings")
    p.add_argument("--jl-projections", type=_ints, default=[],
                   help="comma-separated r values (a Gaussian row is always added)")
    p.add_argument("--sampling", choices=("poisson", "random_allocation", "without_replacement"),
                   action="append",
                   help="add the Gaussian under this sampling (repeat the flag for several; the JL "
                        "curves are Poisson; without_replacement's epsilon is for replacing one "
                        "example); default: poisson")
    p.add_argument("--delta", type=float, required=True, help=delta_help)
    p.add_argument("--plot", help="write a PNG of the curves (needs fdp[plot])")
    p = sub.add_parser("risk", parents=[common, jl],
                       help="bounds on a membership-inference attacker's TPR at given FPRs")
    p.add_argument("--fpr", type=_floats, default=None, help="comma-separated false-positive rates")
    p.add_argument("--plot", help="write a PNG of TPR against FPR (needs fdp[plot])")
    p = sub.add_parser("warmup", help="compile and cache the Numba kernels once, after installing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    parser.commands = dict(sub.choices)
    return parser


