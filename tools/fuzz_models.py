"""The privacy fuzzer's grammar: random Keras models, data and training paths.

A case is drawn from its seed alone (a ``numpy`` generator), so a finding is replayed by
its seed. Families: dense (with a layer shared twice), Conv1D/2D/3D with groups,
dilation and strides, Depthwise/Separable Conv2D, LSTM/GRU/SimpleRNN (Bidirectional,
masked, stacked), MultiHeadAttention, and a user's own layer (a trainable matmul, a
layer that mixes rows with ``keras.ops``, or one that learns a moving mean from
outliers). Any of them may get a normalisation on a random axis (the batch axis
included: LayerNormalization, UnitNormalization, GroupNormalization, Softmax) and
Dropout; the dense, convolutional and recurrent ones a ``softsign`` activation, whose
backward pass TensorFlow cannot differentiate (no forward mode, no double vjp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import keras
import numpy as np

CLASSES = 3
FAMILIES = ("dense", "conv1d", "conv2d", "conv3d", "depthwise", "recurrent", "attention", "custom")
#: paths of the sensitivity and noise checks (one private step each)
STEP_PATHS = ("fit", "fit_jit", "custom_loop", "custom_train_step", "train_on_batch", "distributed")
#: paths of the accounting check (several steps, with what Keras does to weights between)
LEDGER_PATHS = ("fit", "backup_and_restore", "early_stopping", "checkpoint_and_load", "recompile",
                "set_weights", "train_on_batch_after_fit", "custom_loop", "custom_train_step")
OPTIMIZERS = ("vanilla", "jl")
L = keras.layers


@keras.saving.register_keras_serializable(package="fuzz")
class RowMixer(L.Layer):
    """A user's layer that mixes examples: adds half the batch mean (axis 0)."""

    def call(self, inputs: Any) -> Any:
        return inputs + 0.5 * keras.ops.mean(inputs, axis=0, keepdims=True)


@keras.saving.register_keras_serializable(package="fuzz")
class OwnDense(L.Layer):
    """A user's trainable layer written from scratch (add_weight + keras.ops)."""

    def __init__(self, units: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")

    def call(self, inputs: Any) -> Any:
        return keras.ops.tanh(keras.ops.matmul(inputs, self.kernel))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="fuzz")
class OutlierMean(L.Layer):
    """Learns a moving mean of the batch, but only when it holds an outlier (|x| > 5):
    data-dependent state that a check on the first step alone would miss."""

    def build(self, input_shape: Any) -> None:
        self.mean = self.add_weight(shape=(input_shape[-1],), initializer="zeros", trainable=False)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if training:
            outlier = keras.ops.cast(keras.ops.any(keras.ops.abs(inputs) > 5.0), inputs.dtype)
            self.mean.assign(self.mean + outlier * keras.ops.mean(inputs, axis=0))
        return inputs


def _norm_layer(rng: np.random.Generator, rank: int, features: int) -> L.Layer:
    """A normalisation on a random axis of a rank-``rank`` tensor (0: the batch axis, which
    mixes rows; the layers with weights take the last axis instead: Keras cannot build weights
    of the batch's undefined size, and such a case crashed the search)."""
    axis = int(rng.integers(0, rank)) if rng.random() < 0.5 else -1
    kind = str(rng.choice(["layer_norm", "unit_norm", "softmax", "group_norm"]))
    weighted_axis = -1 if axis == 0 else axis
    if kind == "layer_norm":
        return L.LayerNormalization(axis=weighted_axis)
    if kind == "unit_norm":
        return L.UnitNormalization(axis=axis)
    if kind == "group_norm" and features % 2 == 0:
        return L.GroupNormalization(groups=2, axis=weighted_axis if weighted_axis in (-1, rank - 1) else -1)
    return L.Softmax(axis=axis)


def _extras(rng: np.random.Generator, h: Any, dropout: list[bool]) -> Any:
    """Maybe a normalisation on a random axis, maybe Dropout."""
    if rng.random() < 0.35:
        h = _norm_layer(rng, len(h.shape), int(h.shape[-1]))(h)
    if rng.random() < 0.25:
        h = L.Dropout(0.3)(h)
        dropout[0] = True
    return h


def _trunk(family: str, rng: np.random.Generator, inputs: Any, dropout: list[bool],
           activation: str | None = None) -> Any:
    if family == "dense":
        h = L.Dense(6, activation=activation or "tanh")(inputs)
        shared = L.Dense(6, activation=activation or "tanh")
        h = shared(h)
        if rng.random() < 0.4:
            h = shared(h)  # one layer's weights used twice
        return _extras(rng, h, dropout)
    if family in ("conv1d", "conv2d", "conv3d"):
        conv = {"conv1d": L.Conv1D, "conv2d": L.Conv2D, "conv3d": L.Conv3D}[family]
        groups = int(rng.choice([1, 2]))
        dilation = int(rng.choice([1, 2])) if family != "conv3d" else 1
        strides = 1 if dilation > 1 else int(rng.choice([1, 2]))
        h = conv(4, 2, groups=groups, dilation_rate=dilation, strides=strides, padding="same",
                 activation=activation or "relu")(inputs)
        return L.Flatten()(_extras(rng, h, dropout))
    if family == "depthwise":
        layer = (L.DepthwiseConv2D(2, depth_multiplier=2, padding="same") if rng.random() < 0.5
                 else L.SeparableConv2D(4, 2, padding="same"))
        return L.Flatten()(_extras(rng, layer(inputs), dropout))
    if family == "recurrent":
        h = L.Embedding(12, 4, mask_zero=bool(rng.random() < 0.5))(inputs)
        cell = {"lstm": L.LSTM, "gru": L.GRU, "simple": L.SimpleRNN}[str(rng.choice(["lstm", "gru", "simple"]))]
        stacked = bool(rng.random() < 0.3)
        kw = {} if activation is None else {"activation": activation}
        if stacked:
            h = cell(4, return_sequences=True, **kw)(h)
        layer = cell(4, **kw)
        if rng.random() < 0.5:
            layer = L.Bidirectional(layer)
        return layer(h)
    if family == "attention":
        h = L.Dense(4)(inputs)
        h = L.MultiHeadAttention(num_heads=2, key_dim=2)(h, h)
        return L.GlobalAveragePooling1D()(_extras(rng, h, dropout))
    kind = str(rng.choice(["own_dense", "row_mixer", "outlier_mean"]))
    h = {"own_dense": OwnDense(6), "row_mixer": RowMixer(), "outlier_mean": OutlierMean()}[kind](inputs)
    return _extras(rng, L.Dense(6, activation="tanh")(h), dropout)


_SHAPES = {"dense": (5,), "conv1d": (8, 2), "conv2d": (6, 6, 2), "conv3d": (4, 4, 4, 2),
           "depthwise": (5, 5, 2), "recurrent": (5,), "attention": (4, 3), "custom": (5,)}


@dataclass
class Case:
    """One fuzz case: a model builder, its data, an optimizer kind and two paths."""

    seed: int
    family: str
    optimizer: str
    path: str  # of the sensitivity / noise check
    ledger_path: str  # of the accounting check
    dropout: bool
    build: Callable[[], keras.Model] = field(repr=False)
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    activation: str | None = None  # of the trunk's layers; None: each layer's own default
    loss: str = "per_row"  # a name in fuzz_common.LOSSES
    #: the checked steps are later steps of their trace: a clean step ran on it first
    #: (the probe done, nothing pending), so only what a step does in its graph protects it
    later_step: bool = False

    def describe(self) -> str:
        activation = "" if self.activation is None else f"/{self.activation}"
        loss = "" if self.loss == "per_row" else f"/{self.loss}"
        later = "/later_step" if self.later_step else ""
        return f"seed={self.seed} {self.family}{activation}/{self.optimizer}/{self.path}{loss}{later}"


def random_case(seed: int, families: tuple[str, ...] = FAMILIES, paths: tuple[str, ...] = STEP_PATHS,
                softsign: bool | None = None, hostile_loss: bool = False, later_step: bool = False) -> Case:
    """The case of ``seed``: its model family, layers, data, optimizer and paths; ``softsign``
    True or False overrides the drawn activation (the draws are the same either way); with
    ``hostile_loss``, half the cases get a loss with one entry per batch on some batches; with
    ``later_step``, every checked step runs after a clean step on the same trace."""
    rng = np.random.default_rng(seed)
    family = str(rng.choice(families))
    n = int(rng.integers(4, 9))
    data_rng = np.random.default_rng(seed + 1)
    shape = _SHAPES[family]
    if family == "recurrent":
        x = data_rng.integers(0, 12, size=(n, *shape)).astype("int32")
        x[:, 0] = np.maximum(x[:, 0], 1)  # no row entirely masked
    else:
        x = data_rng.normal(size=(n, *shape)).astype("float32")
        if family == "custom" and data_rng.random() < 0.5:
            x[int(data_rng.integers(n)), 0] = 8.0  # an outlier (OutlierMean learns from it)
    y = data_rng.integers(0, CLASSES, size=n).astype("int32")
    layer_seed = int(rng.integers(0, 2**31))
    # the dropout flag is known only once the grammar ran: build once to read it
    dropout = [False]
    activation: list[str | None] = [None]  # drawn last (below), read when the model is built

    def build() -> keras.Model:
        keras.utils.set_random_seed(layer_seed)  # the same initial weights every build
        layer_rng = np.random.default_rng(layer_seed)
        inputs = keras.Input(shape, dtype="int32" if family == "recurrent" else "float32")
        h = _trunk(family, layer_rng, inputs, dropout, activation[0])
        return keras.Model(inputs, L.Dense(CLASSES)(h))

    build()
    case = Case(seed, family, str(rng.choice(OPTIMIZERS)), str(rng.choice(paths)),
                str(rng.choice(LEDGER_PATHS)), dropout[0], build, x, y)
    # drawn last, so the draws above (and every earlier seed's case) are unchanged
    if case.family == "recurrent" and case.optimizer == "jl" and rng.random() < 0.5:
        # the directions carried through the loops in forward mode: one, or three vectorized
        case.optimizer = "jl_forward" if rng.random() < 0.5 else "jl_forward_batched"
    drawn = case.family in ("dense", "conv1d", "conv2d", "conv3d", "recurrent") and rng.random() < 0.2
    if drawn if softsign is None else softsign:
        case.activation = activation[0] = "softsign"
    if hostile_loss and rng.random() < 0.5:  # drawn last and only when asked: the sample is unchanged
        case.loss = "rare_one_entry"
    case.later_step = later_step  # not drawn: the sample is unchanged
    return case
