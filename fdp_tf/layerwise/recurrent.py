"""Keras LSTM / GRU / SimpleRNN, re-run with the input projection outside the time loop.

For the recorded pass only, a recurrent layer is computed by an equivalent
implementation in which X = x W + b (the input projection of every time step) is one
tensor: dL/dX_t is then the gate pre-activation gradient of every step, and

    G_i(W)      = sum_t x_it^T dX_it          (kernel)
    G_i(U)      = sum_t h_i,t-1^T dX_it       (recurrent kernel; GRU: see below)
    G_i(b)      = sum_t dX_it                 (bias)

are in the outer-product form of :mod:`fdp_tf.layerwise.pieces`. GRU: with
``reset_after`` the recurrent part is r * (h U_h + b_rec), so the recurrent kernel's
gradient for the candidate gate is h^T (r * dX_h) and the recurrent bias gets r * dX_h;
without it, U_h multiplies r * h.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fdp_tf.layerwise.pieces import OuterPiece, SumPiece, VariableGradient

__all__ = ["cell_step", "initial_states", "recurrent_forward", "recurrent_gradients", "recurrent_outputs",
           "split_bias", "time_major_mask"]


def recurrent_gradients(tap: Any, grad: tf.Tensor) -> list[VariableGradient]:
    """Pieces of the layer's variables from grad = dL/dX, [b, T, G] in processing order."""
    cell, kind, v = tap.layer.cell, tap.kind, tap.values
    x, h_prev = tf.cast(v["inputs"], grad.dtype), v["h_prev"]
    out = [VariableGradient(cell.kernel, (OuterPiece(x, grad),))]
    if kind == "gru":
        units = cell.units
        gz, gr, gh = tf.split(grad, 3, axis=-1)
        if cell.reset_after:
            grad_rec = tf.concat([gz, gr, v["r"] * gh], axis=-1)
            out.append(VariableGradient(cell.recurrent_kernel, (OuterPiece(h_prev, grad_rec),)))
            if cell.bias is not None:
                out.append(VariableGradient(
                    cell.bias, (SumPiece(grad), SumPiece(grad_rec)),
                    lambda sums: tf.stack(sums, axis=0),
                ))
        else:
            out.append(VariableGradient(
                cell.recurrent_kernel,
                (OuterPiece(h_prev, grad[..., : 2 * units]), OuterPiece(v["r"] * h_prev, gh)),
                lambda sums: tf.concat(sums, axis=1),
            ))
            if cell.bias is not None:
                out.append(VariableGradient(cell.bias, (SumPiece(grad),)))
    else:
        out.append(VariableGradient(cell.recurrent_kernel, (OuterPiece(h_prev, grad),)))
        if cell.bias is not None:
            out.append(VariableGradient(cell.bias, (SumPiece(grad),)))
    return out


def _constant(variable: Any, dtype: Any) -> tf.Tensor:
    return tf.stop_gradient(tf.cast(tf.convert_to_tensor(variable), dtype))


def split_bias(kind: str, cell: Any, bias: tf.Tensor | None) -> tuple[Any, Any]:
    """(input bias, recurrent bias) of a tensor shaped like the cell's bias (the bias itself
    or its tangent): a GRU with ``reset_after`` keeps both in one [2, 3 units] variable."""
    if bias is None:
        return None, None
    if kind == "gru" and cell.reset_after:
        return bias[0], bias[1]
    return bias, None


def time_major_mask(layer: Any, mask: Any, batch: tf.Tensor) -> tf.Tensor | None:
    """Keras's mask [b, T] as [T, b, 1] booleans in processing order, or None."""
    if mask is None:
        return None
    m = tf.cast(tf.nest.flatten(mask)[0], tf.bool)
    if layer.go_backwards:
        m = tf.reverse(m, axis=[1])
    return tf.transpose(tf.reshape(m, (batch, -1)), [1, 0])[:, :, None]


def cell_step(kind: str, cell: Any, recurrent: tf.Tensor, recurrent_bias: Any, h: tf.Tensor, c: Any,
              x_t: tf.Tensor) -> tuple[tf.Tensor, Any, Any]:
    """(h_new, c_new, GRU reset gate or None) of one step of Keras's cell, from the input
    projection x_t = x W + b of the step (gate order and equations as Keras 3's cells)."""
    act, ract = cell.activation, getattr(cell, "recurrent_activation", None)
    if kind == "lstm":
        z = x_t + tf.linalg.matmul(h, recurrent)
        z0, z1, z2, z3 = tf.split(z, 4, axis=-1)
        i, f, o = ract(z0), ract(z1), ract(z3)
        c_new = f * c + i * act(z2)
        return o * act(c_new), c_new, None
    if kind == "gru":
        units = cell.units
        xz, xr, xh = tf.split(x_t, 3, axis=-1)
        if cell.reset_after:
            inner = tf.linalg.matmul(h, recurrent)
            if recurrent_bias is not None:
                inner = inner + recurrent_bias
            rz, rr, rh = tf.split(inner, 3, axis=-1)
            zg, r = ract(xz + rz), ract(xr + rr)
            hh = act(xh + r * rh)
        else:
            inner = tf.linalg.matmul(h, recurrent[:, : 2 * units])
            rz, rr = tf.split(inner, 2, axis=-1)
            zg, r = ract(xz + rz), ract(xr + rr)
            hh = act(xh + tf.linalg.matmul(r * h, recurrent[:, 2 * units :]))
        return zg * h + (1 - zg) * hh, c, r
    h_new = x_t + tf.linalg.matmul(h, recurrent)
    return (act(h_new) if act is not None else h_new), c, None


def recurrent_outputs(layer: Any, hs: tf.Tensor, m: tf.Tensor | None) -> tf.Tensor:
    """The layer's output from the states after each step, hs [T, b, units] (Keras's
    conventions for masked steps and ``return_sequences``); linear in hs, so it also maps
    the states' tangents to the output's."""
    if m is None:
        outs = hs
    elif layer.zero_output_for_mask:
        outs = tf.where(m, hs, tf.zeros_like(hs))
    else:  # Keras repeats the last output (0 before the first unmasked step)
        seen = tf.cast(tf.cumsum(tf.cast(m, tf.int32), axis=0) > 0, tf.bool)
        outs = tf.where(seen, hs, tf.zeros_like(hs))
    output = tf.transpose(outs, [1, 0, 2]) if layer.return_sequences else outs[-1]
    return tf.cast(output, layer.compute_dtype)


def initial_states(kind: str, cell: Any, initial_state: Any, batch: tf.Tensor, dtype: Any) -> list[tf.Tensor]:
    """[h0] or [h0, c0] (LSTM): the given initial state, else zeros."""
    if initial_state is None:
        return [tf.zeros((batch, cell.units), dtype) for _ in range(2 if kind == "lstm" else 1)]
    return [tf.cast(s, dtype) for s in tf.nest.flatten(initial_state)]


def recurrent_forward(tap: Any, sequences: tf.Tensor, initial_state: Any, mask: Any) -> Any:
    """Keras LSTM / GRU / SimpleRNN ``call`` with the input projection outside the loop.

    The weights enter as constants (``tf.stop_gradient``): the tape's gradient of a
    variable then holds only the uses the taps did not see (see ``LayerTaps``).

    Same equations, gate order, masking and output conventions as Keras 3's layers and
    ``backend.rnn`` (``go_backwards``, ``return_sequences``, ``return_state``,
    ``zero_output_for_mask``); records X, the inputs and the states h_{t-1} on ``tap``.
    """
    layer, cell, kind = tap.layer, tap.layer.cell, tap.kind
    dtype = layer.compute_dtype
    x = tf.cast(sequences, dtype)
    if layer.go_backwards:
        x = tf.reverse(x, axis=[1])
    # weights read as constants: their gradient is the taps' (coverage check, taps.py)
    kernel = _constant(cell.kernel, dtype)
    recurrent = _constant(cell.recurrent_kernel, dtype)
    input_bias, recurrent_bias = split_bias(kind, cell, _constant(cell.bias, dtype) if cell.use_bias else None)
    proj = tf.linalg.matmul(x, kernel)  # [b, T, G]
    if input_bias is not None:
        proj = proj + input_bias
    tap.set_target(proj)  # before the loop uses it
    batch = tf.shape(x)[0]
    states = initial_states(kind, cell, initial_state, batch, dtype)
    h0 = states[0]
    c0 = states[1] if kind == "lstm" else None
    m = time_major_mask(layer, mask, batch)
    masked = m is not None

    # the carry is the state only (LSTM: h, c; GRU: h and its reset gate, which the
    # gradient of its recurrent kernel needs; SimpleRNN: h): the outputs and h_{t-1} are
    # read off the stacked states
    def step(carry: tuple, elems: Any) -> tuple:
        h, c = carry[0], (carry[1] if kind == "lstm" else None)
        x_t, m_t = elems if masked else (elems, None)
        h_new, c_new, r = cell_step(kind, cell, recurrent, recurrent_bias, h, c, x_t)
        if masked:  # a masked step keeps the state
            h_new = tf.where(m_t, h_new, h)
            c_new = tf.where(m_t, c_new, c) if kind == "lstm" else c_new
        return {"lstm": (h_new, c_new), "gru": (h_new, r)}.get(kind, (h_new,))

    init = {"lstm": (h0, c0), "gru": (h0, tf.zeros_like(h0))}.get(kind, (h0,))
    time_major = tf.transpose(proj, [1, 0, 2])
    stacked = tf.scan(step, (time_major, m) if masked else time_major, initializer=init)
    hs = stacked[0]  # [T, b, units], the state after each step
    h_prev = tf.concat([h0[None], hs[:-1]], axis=0)
    tap.values = {
        "inputs": x,
        "h_prev": tf.transpose(h_prev, [1, 0, 2]),
        "r": tf.transpose(stacked[1], [1, 0, 2]) if kind == "gru" else None,
    }
    output = recurrent_outputs(layer, hs, m)
    if layer.return_state:
        final = [hs[-1], stacked[1][-1]] if kind == "lstm" else [hs[-1]]
        return (output, *final)
    return output
