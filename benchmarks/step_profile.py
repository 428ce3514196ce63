"""Where a private step of the IMDb BiLSTM spends its time and memory, piece by piece.

Each piece is one ``tf.function`` over the same batch, outside ``fit`` (no run-time
checks, no optimizer): non-DP forward + backward, the layer taps' forward pass alone, their
forward + backward to the pre-activations (on the step's persistent tape, and on a one-shot
tape), plus the per-example LSTM kernel gradients, the whole JL(1) step
(noise off and on), the JL(10) step and the exact step, and JL(1) in forward mode
(``jvp_method="forward"``): the tangent pass through the LSTM loops
(:mod:`fdp_tf.recurrent_tangents`) alone, and the whole step, the tangent pass followed by
an ordinary taped forward + backward pass for the clipped sum; the same for JL(10), its ten
directions vectorized in one tangent pass. Times are medians of interleaved
rounds in one process; memory is the peak RSS above the traced state over three calls,
each piece in its own process. ``--quick`` is a smoke test (4 tokens, batch 4).

    python benchmarks/step_profile.py [--batch-size 64] [--rounds 15] [--memory] [--only JL tangent]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))

from training import peak_rss_mib  # noqa: E402  (this directory: the script's, or the loader's)

PIECES = ("non-DP", "taps forward", "taps forward+backward", "taps forward+backward, one-shot tape",
          "+ per-example G_i", "JL(1), no noise", "JL(1)", "JL(10)", "exact",
          "tangent pass (forward mode through the LSTM)", "JL(1) in forward mode: tangent pass + taped pass",
          "tangent pass, 10 directions vectorized", "JL(10) in forward mode: tangent pass + taped pass")


def _pieces(batch: int, length: int) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from fdp_tf.forward import ForwardPass, RecordedForward
    from fdp_tf.jl import jl_private_gradient, layerwise_jl_gradient, sample_directions
    from fdp_tf.layerwise import LayerTaps
    from fdp_tf.per_example import vanilla_private_gradient
    from fdp_tf.recurrent_tangents import tangent_projections
    from imdb_lstm import VOCAB, build_model

    rng = np.random.default_rng(0)
    x = rng.integers(1, VOCAB, size=(batch, length))
    y = rng.integers(0, 2, size=batch)
    model = build_model(length=length)
    model(x[:1])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    variables = model.trainable_variables

    def forward() -> ForwardPass:
        return ForwardPass(loss_fn(y, model(x, training=True)))

    def non_dp():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(forward().per_example_losses)
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

    def taps(per_example: bool, backward: bool = True, persistent: bool = True):
        def run():
            # the step's tape is persistent (the coverage check, the taps' backward pass and
            # the regularization each read it); the one-shot variant shows what that costs
            with tf.GradientTape(persistent=persistent) as tape:
                tapped = LayerTaps(model, variables, tape)
                with tapped:
                    result = forward()
            losses = result.per_example_losses
            if not backward:  # what the forward pass holds: the pre-activations it returns
                return [t.target for t in tapped.taps]
            if not per_example:
                return tape.gradient(losses, [t.target for t in tapped.taps], output_gradients=tf.ones_like(losses))
            pieces, _ = tapped.variable_gradients(RecordedForward(tape, result), None)
            return [p._per_example if getattr(p, "_explicit_form", False) else getattr(p, "g", p)
                    for vg in pieces for p in vg.pieces]
        return run

    def jl(r: int, sigma: float):
        return lambda: layerwise_jl_gradient(forward, variables, model, l2_norm_clip=1.0, noise_multiplier=sigma,
                                             jl_projections=r, expected_batch_size=batch).gradients

    def exact():
        return vanilla_private_gradient(forward, variables, l2_norm_clip=1.0, noise_multiplier=1.0,
                                        expected_batch_size=batch, per_example_method="layerwise",
                                        model=model).gradients

    def tangent_pass(r: int):
        return lambda: tangent_projections(forward, variables, model, sample_directions(variables, r))[0]

    def jl_two_passes(r: int):
        return lambda: jl_private_gradient(forward, variables, l2_norm_clip=1.0, noise_multiplier=1.0,
                                           jl_projections=r, expected_batch_size=batch, jvp_method="forward",
                                           model=model).gradients

    functions = [non_dp, taps(False, backward=False), taps(False), taps(False, persistent=False), taps(True),
                 jl(1, 0.0), jl(1, 1.0), jl(10, 1.0), exact, tangent_pass(1), jl_two_passes(1), tangent_pass(10),
                 jl_two_passes(10)]
    return {name: tf.function(f) for name, f in zip(PIECES, functions)}


def _finish(out) -> None:
    import tensorflow as tf

    for t in tf.nest.flatten(out):
        if hasattr(t, "numpy"):
            t.numpy()


def times(batch: int, length: int, rounds: int, names: list[str]) -> dict[str, float]:
    import numpy as np

    functions = {name: f for name, f in _pieces(batch, length).items() if name in names}
    for f in functions.values():
        _finish(f())
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, f in functions.items():
            start = time.perf_counter()
            _finish(f())
            seconds[name].append(time.perf_counter() - start)
    return {name: float(np.median(s)) for name, s in seconds.items()}


def memory_child(piece: str, batch: int, length: int) -> float:
    f = _pieces(batch, length)[piece]
    f.get_concrete_function()
    before = peak_rss_mib()
    for _ in range(3):
        _finish(f())
    return peak_rss_mib() - before


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--memory", action="store_true", help="also the peak memory, one process per piece")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 tokens, batch 4, 2 rounds")
    parser.add_argument("--only", nargs="+", default=[],
                        help="only the pieces whose names contain one of these (non-DP always runs)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(memory_child(args.child, args.batch_size, args.length)))
        return
    if args.quick:
        args.batch_size, args.length, args.rounds = 4, 4, 2
    names = [p for p in PIECES if p == "non-DP" or not args.only or any(o in p for o in args.only)]
    result = times(args.batch_size, args.length, args.rounds, names)
    memory: dict[str, float] = {}
    if args.memory:
        for piece in names:
            out = subprocess.run([sys.executable, __file__, "--child", piece, "--batch-size", str(args.batch_size),
                                  "--length", str(args.length)], capture_output=True, text=True, check=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
            memory[piece] = json.loads(out.stdout.strip().splitlines()[-1])
    base = result["non-DP"]
    print(f"IMDb BiLSTM, batch {args.batch_size}, {args.length} tokens, median of {args.rounds} rounds")
    print("| piece | ms | × non-DP |" + (" peak MiB above the traced state |" if memory else ""))
    print("|---|---|---|" + ("---|" if memory else ""))
    for name, seconds in result.items():
        extra = f" {memory[name]:.0f} |" if memory else ""
        print(f"| {name} | {1000 * seconds:.1f} | {seconds / base:.2f}× |{extra}")


if __name__ == "__main__":
    main()
