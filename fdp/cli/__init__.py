"""The ``fdp`` command line: certified epsilon, delta, calibration, curves and attack risk.

    fdp epsilon --mechanism jl --noise-multiplier 0.6 --jl-projections 30 \\
        --batch-size 256 --dataset-size 25000 --epochs 15 --delta 1e-5
    fdp delta ... --epsilon 8
    fdp calibrate ... --target-epsilon 8     # sigma; or r (no --jl-projections); or epochs
    fdp curves --noise-multiplier 0.6 --jl-projections 1,5,10,30 --batch-size 256 \\
        --dataset-size 25000 --epochs 15 --delta 1e-5 --plot curves.png
    fdp risk ... --fpr 1e-4,1e-3,0.01 --plot risk.png
    fdp warmup                                # compile the kernels once (seconds off every first query)

Steps are either ``--sampling-rate`` and ``--steps``, or ``--batch-size``,
``--dataset-size`` and ``--epochs`` (fdp.epochs: ceil(N/B) steps per epoch).
``--json`` prints one JSON object instead of text. A bad flag prints one line
naming it and exits with status 2; an unreachable target exits with status 1.
"""

from __future__ import annotations

import json
import sys

from fdp.cli.arguments import FLAGS, Unreachable, UsageError, flag_error
from fdp.cli.calibrate import cmd_calibrate
from fdp.cli.commands import cmd_curves, cmd_delta, cmd_epsilon, cmd_risk, cmd_warmup
from fdp.cli.parser import build_parser

__all__ = ["main"]

COMMANDS = {"epsilon": cmd_epsilon, "delta": cmd_delta, "calibrate": cmd_calibrate,
            "curves": cmd_curves, "risk": cmd_risk, "warmup": cmd_warmup}


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 unreachable target, 2 bad flag)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"fdp {args.command}"
    try:
        data, text = COMMANDS[args.command](args)
    except UsageError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except Unreachable as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"{prog}: error: {flag_error(err, FLAGS)}", file=sys.stderr)
        return 2
    print(json.dumps({"command": args.command, **data}) if args.json else text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

