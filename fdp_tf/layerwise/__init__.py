"""Exact per-example gradient norms layer by layer (``per_example_method="layerwise"``).

support: which layers are handled (static filter); pieces: per-example gradients in
outer-product form; recurrent: RNNs with the input projection outside the loop;
taps: recording, norms, JL projections, the released reconstruction and its coverage
check.
"""

from fdp_tf.layerwise.support import layerwise_unsupported, tap_kind
from fdp_tf.layerwise.taps import (
    LayerTaps,
    LayerwiseNorms,
    LayerwisePieces,
    escaped_gradients_vanish,
    layerwise_norms,
    layerwise_pieces,
    layerwise_projections,
    reconstructed_sum,
)

__all__ = [
    "LayerTaps",
    "LayerwiseNorms",
    "LayerwisePieces",
    "escaped_gradients_vanish",
    "layerwise_norms",
    "layerwise_pieces",
    "layerwise_projections",
    "layerwise_unsupported",
    "reconstructed_sum",
    "tap_kind",
]
