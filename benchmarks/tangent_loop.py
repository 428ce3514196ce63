"""What r tangents through one LSTM loop cost, and what the converted loop carries.

Part 1 times one LSTM layer's recurrence (batch B, T steps, d inputs, u units), r directions
of the weights and of the input sequence, by three routes, in interleaved rounds of one process:

* the primal loop alone (``tf.while_loop`` over the cell);
* fdp_tf's route: TensorFlow's forward mode opened inside the loop body for one direction,
  the r directions under ``tf.vectorized_map`` (what :mod:`fdp_tf.recurrent_tangents` does);
* a hand-written LSTM jvp with the r tangents fused: xdot K and hdot U as one [r*B, .]
  product each, x V_K and h V_U as one [B, r*4u] product each (a prototype, not in fdp_tf).

The two tangent routes must agree (their relative difference is printed); the table gives
each route's median time as a multiple of the primal loop's.

Part 2 (``--graph``) traces fdp_tf's own tangent pass (Embedding -> LSTM -> Dense, r
directions) and prints the input shapes of every ``While``/``StatelessWhile`` in the graph:
which loop variables the vectorization stacked along the directions (a leading r) and which
it kept unstacked (the primal state, computed once).

    python benchmarks/tangent_loop.py [--projections 1 10] [--batch-size 64] [--steps 150]
        [--rounds 7] [--graph] [--png tangent_loop.png] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _routes(batch: int, steps: int, width: int, r: int) -> dict:
    """The three routes as traced ``tf.function``s over the same random inputs."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    const = lambda *shape, scale=1.0: tf.constant((rng.normal(size=shape) * scale).astype("float32"))  # noqa: E731
    d = u = width
    x, x_dot = const(batch, steps, d), const(r, batch, steps, d)
    kernel, recurrent = const(d, 4 * u, scale=0.1), const(u, 4 * u, scale=0.1)
    bias = tf.zeros([4 * u])
    v_kernel, v_recurrent, v_bias = const(r, d, 4 * u), const(r, u, 4 * u), const(r, 4 * u)

    def cell(h, c, z):
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
        c_next = tf.sigmoid(z_f) * c + tf.sigmoid(z_i) * tf.tanh(z_c)
        return tf.sigmoid(z_o) * tf.tanh(c_next), c_next

    zeros = tf.zeros([batch, u])

    @tf.function
    def primal():
        def body(t, h, c):
            return (t + 1, *cell(h, c, x[:, t] @ kernel + bias + h @ recurrent))
        return tf.while_loop(lambda t, *_: t < steps, body, (0, zeros, zeros))[1]

    def one_direction(args):
        x_dot1, v_kernel1, v_recurrent1, v_bias1 = args

        def body(t, h, c, h_dot, c_dot):
            projected = x[:, t] @ kernel + bias
            projected_dot = x_dot1[:, t] @ kernel + x[:, t] @ v_kernel1 + v_bias1
            with tf.autodiff.ForwardAccumulator([h, c, projected, recurrent],
                                                [h_dot, c_dot, projected_dot, v_recurrent1]) as acc:
                h_next, c_next = cell(h, c, projected + h @ recurrent)
            return t + 1, h_next, c_next, acc.jvp(h_next), acc.jvp(c_next)

        return tf.while_loop(lambda t, *_: t < steps, body, (0, zeros, zeros, zeros, zeros))[3]

    @tf.function
    def vectorized():
        return tf.vectorized_map(one_direction, (x_dot, v_kernel, v_recurrent, v_bias), fallback_to_while_loop=False)

    # V as [d, r*4u]: one product gives every direction's x V_K
    v_kernel_flat = tf.reshape(tf.transpose(v_kernel, [1, 0, 2]), [d, r * 4 * u])
    v_recurrent_flat = tf.reshape(tf.transpose(v_recurrent, [1, 0, 2]), [u, r * 4 * u])

    @tf.function
    def fused():
        def body(t, h, c, h_dot, c_dot):
            x_t = x[:, t]
            z = x_t @ kernel + bias + h @ recurrent
            z_dot = tf.reshape(tf.reshape(x_dot[:, :, t], [r * batch, d]) @ kernel
                               + tf.reshape(h_dot, [r * batch, u]) @ recurrent, [r, batch, 4 * u])
            z_dot += tf.transpose(tf.reshape(x_t @ v_kernel_flat + h @ v_recurrent_flat, [batch, r, 4 * u]),
                                  [1, 0, 2]) + v_bias[:, None]
            z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
            d_i, d_f, d_c, d_o = tf.split(z_dot, 4, axis=-1)
            i, f, o, g = tf.sigmoid(z_i), tf.sigmoid(z_f), tf.sigmoid(z_o), tf.tanh(z_c)
            c_next = f * c + i * g
            tanh_c = tf.tanh(c_next)
            c_dot_next = f * (1 - f) * d_f * c + f * c_dot + i * (1 - i) * d_i * g + i * (1 - g * g) * d_c
            h_dot_next = o * (1 - o) * d_o * tanh_c + o * (1 - tanh_c * tanh_c) * c_dot_next
            return t + 1, o * tanh_c, c_next, h_dot_next, c_dot_next

        start = (0, zeros, zeros, tf.zeros([r, batch, u]), tf.zeros([r, batch, u]))
        return tf.while_loop(lambda t, *_: t < steps, body, start)[3]

    return {"primal loop": primal, "forward mode, vectorized (fdp_tf)": vectorized, "hand-written jvp, fused": fused}


def time_routes(batch: int, steps: int, width: int, r: int, rounds: int) -> dict:
    """Median seconds of each route (interleaved rounds after one traced call each) and the
    tangent routes' relative difference."""
    import numpy as np

    routes = _routes(batch, steps, width, r)
    vectorized = routes["forward mode, vectorized (fdp_tf)"]().numpy()
    fused = routes["hand-written jvp, fused"]().numpy()
    routes["primal loop"]()
    disagreement = float(np.abs(vectorized - fused).max() / np.abs(vectorized).max())
    times: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(rounds):
        for name, fn in routes.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {"median_s": {name: statistics.median(ts) for name, ts in times.items()},
            "spread_s": {name: (min(ts), max(ts)) for name, ts in times.items()},
            "disagreement": disagreement}


def loop_shapes(batch: int = 16, steps: int = 7, units: int = 13, r: int = 5) -> list[tuple[str, list]]:
    """(op type, input shapes) of every while loop in fdp_tf's traced tangent pass."""
    import keras
    import numpy as np
    import tensorflow as tf

    from fdp_tf.forward import ForwardPass
    from fdp_tf.recurrent_tangents import tangent_projections

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((steps,), dtype="int32"), keras.layers.Embedding(50, 11),
                              keras.layers.LSTM(units), keras.layers.Dense(2)])
    x = np.random.default_rng(0).integers(1, 50, size=(batch, steps))
    y = np.zeros(batch, int)
    model(x)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    variables = model.trainable_variables
    directions = [tf.random.normal((r, *v.shape)) for v in variables]
    traced = tf.function(lambda: tangent_projections(
        lambda: ForwardPass(loss_fn(y, model(x, training=True))), variables, model, directions)
    ).get_concrete_function()
    found: list[tuple[str, list]] = []

    def walk(graph) -> None:
        for op in graph.get_operations():
            if op.type in ("While", "StatelessWhile"):
                found.append((op.type, [tuple(t.shape) for t in op.inputs]))
            for attr in ("body", "then_branch", "else_branch", "f"):
                try:
                    fn = op.get_attr(attr)
                except (ValueError, TypeError):
                    continue
                inner = graph._get_function(fn.name) if hasattr(fn, "name") else None  # noqa: SLF001
                if inner is not None:
                    walk(inner.graph)

    walk(traced.graph)
    return found


def _plot(path: str, rows: dict[int, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    rs = sorted(rows)
    for name in ("forward mode, vectorized (fdp_tf)", "hand-written jvp, fused"):
        ax.plot(rs, [rows[r]["median_s"][name] / rows[r]["median_s"]["primal loop"] for r in rs], "o-", label=name)
    ax.set_xlabel("directions r")
    ax.set_ylabel("time / primal loop")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--projections", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150, help="time steps T of the sequence")
    parser.add_argument("--width", type=int, default=64, help="inputs and units of the LSTM")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--graph", action="store_true", help="also print the converted loops' input shapes")
    parser.add_argument("--png", default="")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.projections, args.batch_size, args.steps, args.width, args.rounds = [1, 3], 4, 5, 8, 1
        args.graph = True
    for name in ("batch_size", "steps", "width", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.projections) < 1:
        parser.error(f"--projections must be >= 1, got {args.projections}")

    from tqdm import tqdm

    print(f"LSTM loop: B = {args.batch_size}, T = {args.steps}, d = u = {args.width}, "
          f"{args.rounds} interleaved rounds, medians")
    rows = {r: time_routes(args.batch_size, args.steps, args.width, r, args.rounds)
            for r in tqdm(args.projections, desc="tangent_loop", unit="r", file=sys.stderr)}
    print("| r | primal loop | forward mode, vectorized (fdp_tf) | hand-written jvp, fused | routes differ by |")
    print("|---|---|---|---|---|")
    for r, row in rows.items():
        base = row["median_s"]["primal loop"]
        ratios = [row["median_s"][name] / base for name in ("forward mode, vectorized (fdp_tf)", "hand-written jvp, fused")]
        print(f"| {r} | 1.00x ({base * 1e3:.1f} ms) | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {row['disagreement']:.1e} |")
    if len(rows) > 1:
        low, high = min(rows), max(rows)
        for name in ("forward mode, vectorized (fdp_tf)", "hand-written jvp, fused"):
            ratio = {r: rows[r]["median_s"][name] / rows[r]["median_s"]["primal loop"] for r in (low, high)}
            slope = (ratio[high] - ratio[low]) / (high - low)
            print(f"each further direction, {name}: {slope:.2f} primal loops")
    if args.graph:
        print("\nfdp_tf's tangent pass (Embedding -> LSTM(13) -> Dense, B = 16, T = 7, r = 5): while loops' inputs")
        for op_type, shapes in loop_shapes():
            print(f"  {op_type}: {shapes}")
    if args.png:
        _plot(args.png, rows)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
