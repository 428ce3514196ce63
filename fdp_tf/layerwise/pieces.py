"""Per-example gradients of one layer's variables, as sums of outer products.

For the layers the taps handle, the gradient of example i's loss with respect to a
(slice of a) variable is

    G_i = sum_n a_in^T g_in                                   (outer product form)

with a the layer's input (or recurrent state) at position n and g the gradient of
the loss with respect to the layer's pre-activation there (Goodfellow 2015,
"Efficient per-example gradient computations"; Li et al. 2022, "ghost clipping").
From a and g alone, without materialising the G_i of the whole model:

    ||G_i||_F^2 = sum_{n,m} (a_in . a_im)(g_in . g_im)            (Gram form) or
                  ||a_i^T g_i||_F^2                               (explicit form),
    sum_i w_i G_i = (w * a)^T g                                   (the weighted sum),
    <G_i, V_j>    = sum_n (a_in V_j) . g_in                       (JL projections).

The last is the forward-mode derivative of l_i in direction V_j evaluated by the
tangent-adjoint identity: a_in V_j is the tangent of the pre-activation at n when the
weights move along V_j, g_in its adjoint, so the r projections of DP-SGD-JL cost one
product with the layer's input per direction, and no pass through the network.

A bias is the case a_in = 1 (G_i = sum_n g_in); an embedding table the case of
one-hot a (rows selected by the token ids). A variable may be made of several
disjoint slices (e.g. a GRU's recurrent kernel), each its own piece, so its squared
norm is the sum over its pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import tensorflow as tf

__all__ = ["EmbeddingPiece", "OuterPiece", "SumPiece", "VariableGradient", "flatten_middle"]


def flatten_middle(t: tf.Tensor) -> tf.Tensor:
    """[b, ..., k] -> [b, n, k]."""
    shape = tf.shape(t)
    return tf.reshape(t, tf.stack([shape[0], -1, shape[-1]]))


def _sq_rows(t: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.reshape(tf.square(t), (tf.shape(t)[0], -1)), axis=1)


def _keep_rows(t: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
    """Zero the rows of dropped examples, so that their inf or NaN cannot reach a sum."""
    mask = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones([tf.rank(t) - 1], tf.int32)], 0))
    return tf.where(mask, t, tf.zeros_like(t))


def _row_weights(weights: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    w = tf.cast(weights, t.dtype)
    return tf.reshape(w, tf.concat([tf.shape(w), tf.ones([tf.rank(t) - 1], tf.int32)], 0))


@dataclass(frozen=True)
class OuterPiece:
    """G_i = sum_n a_in^T g_in with a: [b, n, p], g: [b, n, q]; G_i has shape [p, q]."""

    a: tf.Tensor
    g: tf.Tensor

    @property
    def _explicit_form(self) -> bool:
        """Materialise the b matrices G_i (cheaper than the Gram form when n(p+q) >= pq)?"""
        n, p, q = self.a.shape[1], self.a.shape[-1], self.g.shape[-1]
        if n == 1:
            return False
        return not (n is not None and p is not None and q is not None and n * (p + q) < p * q)

    @cached_property
    def _per_example(self) -> tf.Tensor:
        """The G_i themselves, [b, p, q] (computed once; the norms and the sum share it)."""
        return tf.linalg.matmul(tf.cast(self.a, self.g.dtype), self.g, transpose_a=True)

    def squared_norms(self) -> tf.Tensor:
        """||G_i||_F^2, exact; the cheaper of the Gram and the explicit form."""
        a, g = tf.cast(self.a, self.g.dtype), self.g
        if a.shape[1] == 1:
            return tf.reduce_sum(tf.square(a), axis=[1, 2]) * tf.reduce_sum(tf.square(g), axis=[1, 2])
        if self._explicit_form:
            return tf.reduce_sum(tf.square(self._per_example), axis=[1, 2])
        gram_a = tf.linalg.matmul(a, a, transpose_b=True)
        gram_g = tf.linalg.matmul(g, g, transpose_b=True)
        return tf.reduce_sum(gram_a * gram_g, axis=[1, 2])

    def weighted_sum(self, weights: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
        """sum_i w_i G_i, shape [p, q]."""
        if self._explicit_form:
            per_example = _keep_rows(self._per_example, keep)
            return tf.tensordot(tf.cast(weights, per_example.dtype), per_example, axes=1)
        a = _keep_rows(tf.cast(self.a, self.g.dtype), keep)
        g = _keep_rows(self.g, keep)
        a = a * _row_weights(weights, a)
        flat_a = tf.reshape(a, (-1, tf.shape(a)[-1]))
        flat_g = tf.reshape(g, (-1, tf.shape(g)[-1]))
        return tf.linalg.matmul(flat_a, flat_g, transpose_a=True)

    def projections(self, directions: tf.Tensor) -> tf.Tensor:
        """<G_i, V_j> for directions V of shape [r, p, q]; shape [b, r]."""
        a, g = tf.cast(self.a, self.g.dtype), self.g
        v = tf.cast(directions, g.dtype)
        if a.shape[1] == 1:  # one position: (a_i V_j) . g_i
            return tf.einsum("brq,bq->br", tf.einsum("bp,rpq->brq", a[:, 0], v), g[:, 0])
        if self._explicit_form:  # G_i is materialised anyway (norms, sum): one product
            flat = tf.reshape(self._per_example, (tf.shape(g)[0], -1))
            return tf.linalg.matmul(flat, tf.reshape(v, (tf.shape(v)[0], -1)), transpose_b=True)
        # large p q, few positions: the tangent a V_j, one direction at a time
        flat_a = tf.reshape(a, (-1, tf.shape(a)[-1]))
        columns = []
        for j in range(_directions_count(v)):
            tangent = tf.reshape(tf.linalg.matmul(flat_a, v[j]), tf.shape(g))
            columns.append(tf.reduce_sum(tangent * g, axis=[1, 2]))
        return tf.stack(columns, axis=1)


@dataclass(frozen=True)
class SumPiece:
    """G_i = sum_n g_in with g: [b, n, q] (a bias); G_i has shape [q]."""

    g: tf.Tensor

    def squared_norms(self) -> tf.Tensor:
        return _sq_rows(tf.reduce_sum(self.g, axis=1))

    def weighted_sum(self, weights: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
        g = _keep_rows(tf.reduce_sum(self.g, axis=1), keep)
        return tf.reduce_sum(g * _row_weights(weights, g), axis=0)

    def projections(self, directions: tf.Tensor) -> tf.Tensor:
        """<G_i, v_j> for directions of shape [r, q]; shape [b, r]."""
        return tf.linalg.matmul(tf.reduce_sum(self.g, axis=1), tf.cast(directions, self.g.dtype),
                                transpose_b=True)


@dataclass(frozen=True)
class EmbeddingPiece:
    """G_i = sum_n e_{id_in} g_in^T: row id of the table gets g_in; G_i: [rows, d].

    Attributes:
      ids: token ids, [b, n] (int).
      g: gradient of the loss with respect to the looked-up vectors, [b, n, d].
      rows: the table's number of rows.
    """

    ids: tf.Tensor
    g: tf.Tensor
    rows: int

    def squared_norms(self) -> tf.Tensor:
        """sum over the distinct ids of example i of ||sum of its g_in||^2."""
        ids, g = tf.cast(self.ids, tf.int64), self.g
        b, n = tf.shape(ids)[0], tf.shape(ids)[1]
        rows = tf.constant(self.rows, tf.int64)
        example = tf.repeat(tf.range(tf.cast(b, tf.int64)), n)
        keys = example * rows + tf.reshape(ids, (-1,))
        unique, index = tf.unique(keys)
        summed = tf.math.unsorted_segment_sum(
            tf.reshape(g, (-1, tf.shape(g)[-1])), index, tf.shape(unique)[0]
        )
        return tf.math.unsorted_segment_sum(
            tf.reduce_sum(tf.square(summed), axis=1), tf.cast(unique // rows, tf.int32), b
        )

    def weighted_sum(self, weights: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
        g = _keep_rows(self.g, keep)
        g = g * _row_weights(weights, g)
        return tf.math.unsorted_segment_sum(
            tf.reshape(g, (-1, tf.shape(g)[-1])),
            tf.reshape(tf.cast(self.ids, tf.int32), (-1,)),
            self.rows,
        )

    def projections(self, directions: tf.Tensor) -> tf.Tensor:
        """<G_i, V_j> = sum_n V_j[id_in] . g_in for directions [r, rows, d]; shape [b, r]."""
        v = tf.cast(directions, self.g.dtype)
        ids = tf.cast(self.ids, tf.int32)
        columns = [tf.reduce_sum(tf.gather(v[j], ids) * self.g, axis=[1, 2])
                   for j in range(_directions_count(v))]
        return tf.stack(columns, axis=1)


Piece = Any  # OuterPiece | SumPiece | EmbeddingPiece


@dataclass(frozen=True)
class VariableGradient:
    """The per-example gradient of one variable, as pieces over disjoint slices.

    Attributes:
      variable: the variable.
      pieces: one piece per slice.
      assemble: maps the pieces' weighted sums to a tensor of the variable's shape
        (default: the single piece reshaped).
    """

    variable: Any
    pieces: tuple[Piece, ...]
    assemble: Callable[[list[tf.Tensor]], tf.Tensor] | None = None

    def squared_norms(self) -> tf.Tensor:
        """||G_i(variable)||^2, shape [b]."""
        return tf.add_n([p.squared_norms() for p in self.pieces])

    def weighted_sum(self, weights: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
        """sum_i w_i G_i(variable), in the variable's shape; dropped rows excluded."""
        sums = [p.weighted_sum(weights, keep) for p in self.pieces]
        if self.assemble is not None:
            return self.assemble(sums)
        return tf.reshape(sums[0], tuple(self.variable.shape))

    def projections(self, directions: tf.Tensor) -> tf.Tensor:
        """<G_i(variable), V_j> for directions of shape [r, *variable.shape]; [b, r].

        The pieces cover disjoint slices, so the projection is the sum of each piece's
        projection on its slice of V_j. The slices are read through ``assemble``'s
        transpose (it is linear: a stack or a concatenation), so no slicing rule is
        written twice."""
        if self.assemble is None:
            piece = self.pieces[0]
            shape = tf.concat([[_directions_count(directions)], _piece_shape(piece)], 0)
            return piece.projections(tf.reshape(directions, shape))
        slices = _assemble_transpose(self, directions)
        return tf.add_n([p.projections(s) for p, s in zip(self.pieces, slices)])


def _directions_count(directions: tf.Tensor) -> int:
    r = directions.shape[0]
    if r is None:
        raise ValueError("the number of JL directions must be known when tracing")
    return int(r)


def _piece_shape(piece: Piece) -> tf.Tensor:
    """The shape of one example's G_i for ``piece``."""
    if isinstance(piece, OuterPiece):
        return tf.stack([tf.shape(piece.a)[-1], tf.shape(piece.g)[-1]])
    if isinstance(piece, SumPiece):
        return tf.shape(piece.g)[-1:]
    return tf.stack([piece.rows, tf.shape(piece.g)[-1]])


def _assemble_transpose(vg: VariableGradient, directions: tf.Tensor) -> list[tf.Tensor]:
    """Per piece, the slices of the directions [r, *variable.shape]: the vjp of the
    linear ``assemble`` at each direction, stacked to [r, *piece shape]."""
    zeros = [tf.zeros(_piece_shape(p), directions.dtype) for p in vg.pieces]
    per_direction = []
    for j in range(_directions_count(directions)):
        with tf.GradientTape() as tape:
            tape.watch(zeros)
            assembled = vg.assemble(zeros)  # type: ignore[misc]
        per_direction.append(tape.gradient(assembled, zeros, output_gradients=directions[j]))
    return [tf.stack([d[k] for d in per_direction]) for k in range(len(zeros))]
