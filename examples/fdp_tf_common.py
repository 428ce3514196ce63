"""Shared command line and training loop of the fdp_tf examples.

Not an API: the examples import it from their own directory.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# TensorFlow's native libraries log at start-up (oneDNN, CUDA stubs, CPU features; the
# set twice, once per library that carries its own copy of absl), below the reach of
# TF_CPP_MIN_LOG_LEVEL. These lines are dropped; anything else TensorFlow prints passes.
_START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I0000 \S+ +\d+ \S+\] "
    r"|E0000 \S+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.)"
)


def _start_tensorflow_quietly() -> None:
    """Import TensorFlow and list its devices with its start-up lines filtered out."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # where the CUDA probe logs, on a machine without one
        finally:  # also when the import fails: its message is not noise
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if not _START_UP_NOISE.match(line):
                    print(line, file=sys.stderr)


_start_tensorflow_quietly()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import fdp_tf  # noqa: E402

OPTIMIZERS = ("jl-adam", "jl-sgd", "vanilla-adam", "vanilla-sgd", "adam", "sgd")


def add_common_arguments(parser: argparse.ArgumentParser, *, learning_rate: float,
                         noise_multiplier: float, batch_size: int, epochs: int,
                         num_examples: int) -> None:
    parser.add_argument("--data", help="path to the data set (.npz); omit with --synthetic")
    parser.add_argument("--synthetic", action="store_true",
                        help="random data with the real shapes (no download needed)")
    parser.add_argument("--num-examples", type=int, default=num_examples,
                        help="training examples for --synthetic (default %(default)s)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="jl-adam")
    parser.add_argument("--jl-projections", type=int, default=30,
                        help="r (JL optimizers); the seed uses r = 30 at sigma = 0.6 for epsilon ~ 13 "
                             "on IMDb, while r = 1 gives epsilon ~ 1e11")
    parser.add_argument("--jvp-method", default="auto",
                        choices=("auto", "layerwise", "forward", "double_vjp", "loop"),
                        help="how the JL projections are computed (docs/training.md)")
    parser.add_argument("--noise-multiplier", type=float, default=noise_multiplier)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help="expected batch size B of the Poisson sampling")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--no-epsilon", action="store_true", help="skip the accountant")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the synthetic data, the initial weights, the batches and the "
                             "noise (reproducible, therefore NOT private); default: OS entropy")


def make_optimizer(args: argparse.Namespace) -> keras.optimizers.Optimizer:
    dp = dict(l2_norm_clip=args.l2_norm_clip, noise_multiplier=args.noise_multiplier,
              learning_rate=args.learning_rate)
    jl = dict(jl_projections=args.jl_projections, jvp_method=args.jvp_method)
    factories: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
        "jl-adam": lambda: fdp_tf.DPAdamJL(**dp, **jl),  # seed=None: OS-entropy noise
        "jl-sgd": lambda: fdp_tf.DPSGDJL(**dp, **jl),
        "vanilla-adam": lambda: fdp_tf.DPAdamVanilla(**dp),
        "vanilla-sgd": lambda: fdp_tf.DPSGDVanilla(**dp),
        "adam": lambda: keras.optimizers.Adam(args.learning_rate),
        "sgd": lambda: keras.optimizers.SGD(args.learning_rate),
    }
    return factories[args.optimizer]()


def train(model: keras.Model, data: tuple[Any, Any, Any, Any], args: argparse.Namespace) -> None:
    """make_private + Poisson batches + fit with epsilon in the logs + evaluate."""
    x_train, y_train, x_test, y_test = data
    print(f"model parameters: {model.count_params():,}; training examples: {len(x_train):,}")
    optimizer = make_optimizer(args)
    private = fdp_tf.make_private(
        model,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        metrics=["accuracy"],
    )
    batches = fdp_tf.poisson_batches(x_train, y_train, expected_batch_size=args.batch_size,
                                     seed=args.seed)  # None: OS entropy, the private choice
    callbacks = []
    if isinstance(optimizer, fdp_tf.DPOptimizer) and not args.no_epsilon:
        callbacks.append(fdp_tf.PrivacyCallback(delta=args.delta))
    start = time.perf_counter()
    history = private.fit(batches, epochs=args.epochs, callbacks=callbacks, verbose=2)
    seconds = time.perf_counter() - start
    result = private.evaluate(x_test, y_test, verbose=0, return_dict=True)
    print(f"test accuracy {result['accuracy']:.4f}; {seconds / args.epochs:.1f} s per epoch "
          "(the first epoch includes tracing)")
    if "epsilon" in history.history:
        print(f"epsilon (upper bound) at delta={args.delta:g}: {history.history['epsilon'][-1]:.4g} "
              f"after {private.ledger.steps} steps at sampling rate "
              f"{private.ledger.segments[-1].sampling_rate:.4g}")


def check_data_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.synthetic and not args.data:
        parser.error("give --data PATH (a local .npz) or --synthetic; nothing is downloaded")
    if args.seed is not None:
        keras.utils.set_random_seed(args.seed)
        np.random.seed(args.seed)
