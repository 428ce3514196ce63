"""DP-Adam-JL on the seed's IMDb model (Bu et al., arXiv:2102.03013v1, Section 4.1).

Embedding(8185, 64) -> Bidirectional(LSTM(64)) -> Dense(64, relu) -> Dense(2),
sequences of 150 tokens: 598,274 parameters (checked at start-up). The paper
trains with B = 256, sigma = 0.6, C = 1, lr = 1e-3, 15 epochs on N = 25,000.

Run (synthetic data with the real shapes; 56 s on a 2-core VM)::

    python examples/imdb_lstm.py --synthetic

Real data: a local Keras-format ``imdb.npz`` (arrays x_train, y_train, x_test,
y_test of word-index lists, as ``keras.datasets.imdb`` stores them)::

    python examples/imdb_lstm.py --data ~/.keras/datasets/imdb.npz --epochs 15 \\
        --batch-size 256 --noise-multiplier 0.6 --learning-rate 1e-3 --jl-projections 5

Word indices >= 8185 become the out-of-vocabulary token, as the paper's 8k vocabulary.
DP-Adam-JL reads the projections from the layer taps (``jvp_method="layerwise"``): one
forward and one backward pass through the LSTM loops for any r. ``--unroll`` unrolls the
LSTM instead (much longer tracing).
"""

from __future__ import annotations

import argparse

import numpy as np

from fdp_tf_common import add_common_arguments, check_data_arguments, train

VOCAB = 8185
LENGTH = 150
PARAMETERS = 598_274


def build_model(unroll: bool = False, length: int = LENGTH):
    """The seed's model; ``length`` (tokens per review) does not change the parameter count."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((length,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 64),
            keras.layers.Bidirectional(keras.layers.LSTM(64, unroll=unroll)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    assert model.count_params() == PARAMETERS, model.count_params()
    return model


def pad(sequences, length: int = LENGTH) -> np.ndarray:
    """Keras-style pre-padding / pre-truncation with zeros."""
    out = np.zeros((len(sequences), length), dtype=np.int32)
    for i, seq in enumerate(sequences):
        seq = np.asarray(seq, dtype=np.int64)[-length:]
        out[i, length - len(seq):] = seq
    return out


def load_imdb(path: str):
    """Keras ``imdb.npz``: start token 1, OOV token 2, word indices shifted by 3."""
    with np.load(path, allow_pickle=True) as f:
        parts = [f["x_train"], f["y_train"], f["x_test"], f["y_test"]]

    def encode(rows):
        encoded = []
        for row in rows:
            words = np.asarray(row, dtype=np.int64) + 3
            words[words >= VOCAB] = 2
            encoded.append(np.concatenate([[1], words]))
        return pad(encoded)

    return encode(parts[0]), parts[1].astype(np.int32), encode(parts[2]), parts[3].astype(np.int32)


def synthetic_imdb(n_train: int, seed: int):
    """Random reviews of 30-150 tokens; label 1 reviews carry token 7 a few times, label 0 token 8."""
    rng = np.random.default_rng(seed)

    def make(n):
        labels = rng.integers(0, 2, size=n).astype(np.int32)
        rows = []
        for label in labels:
            row = rng.integers(3, VOCAB, size=rng.integers(30, LENGTH + 1))
            row[rng.integers(0, len(row), size=5)] = 7 if label else 8
            rows.append(row)
        return pad(rows), labels

    x_train, y_train = make(n_train)
    x_test, y_test = make(max(n_train // 4, 64))
    return x_train, y_train, x_test, y_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, learning_rate=1e-2, noise_multiplier=0.6, batch_size=64,
                         epochs=3, num_examples=1024)
    parser.add_argument("--unroll", action="store_true", help="unroll the LSTM (Keras's unroll=True)")
    args = parser.parse_args()
    check_data_arguments(parser, args)
    data = synthetic_imdb(args.num_examples, args.seed) if args.synthetic else load_imdb(args.data)
    train(build_model(args.unroll), data, args)


if __name__ == "__main__":
    main()
