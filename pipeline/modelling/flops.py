"""Model FLOPs of masked-LM training, counted from the model's shape: the numerator of an efficiency figure.

A FLOP is one multiply or one add (a multiply-add is 2). Only matrix products count: the layer norms,
softmax, GELU and the optimiser are a few percent at these widths and are what a roofline leaves out too.
``tests/unit/test_flops.py`` checks the count against PyTorch's own ``FlopCounterMode`` on a small BERT.
"""

from __future__ import annotations

from typing import Any

MLM_MASKED_SHARE = 0.15  # masked positions per token: the MLM head's work is counted there only


def encoder_flops_per_token(config: Any, seq_len: int) -> int:
    """Forward FLOPs of a BERT encoder per token of a ``seq_len``-token sequence (every layer: Q, K, V and
    output projections, the two feed-forward products, and the attention scores and weighted sum over
    ``seq_len`` keys)."""
    h, i = config.hidden_size, config.intermediate_size
    projections = 2 * 4 * h * h  # Q, K, V, out: (1 x h) @ (h x h) each
    feed_forward = 2 * 2 * h * i  # up and down
    attention = 2 * 2 * seq_len * h  # q . k over seq_len keys, then the weighted sum of seq_len values
    return config.num_hidden_layers * (projections + feed_forward + attention)


def mlm_head_flops(config: Any) -> int:
    """Forward FLOPs of BERT's MLM head for one position: the transform (h x h) and the decoder (h x vocab)."""
    h = config.hidden_size
    return 2 * h * h + 2 * h * config.vocab_size


def mlm_train_flops_per_token(config: Any, seq_len: int, masked_share: float = MLM_MASKED_SHARE) -> float:
    """Training FLOPs per input token: forward and backward (twice the forward: the gradients of the inputs
    and of the weights) of the encoder over every token and of the MLM head at the masked positions only.

    This is the model's necessary work, the same for every recipe: a head applied at every position, or
    padding, costs the machine more but counts nothing more here."""
    forward = encoder_flops_per_token(config, seq_len) + masked_share * mlm_head_flops(config)
    return 3 * forward


def electra_train_flops_per_token(
    config: Any, seq_len: int, generator_layers: int, masked_share: float = MLM_MASKED_SHARE
) -> float:
    """Training FLOPs per input token of ELECTRA's pair (:mod:`pipeline.modelling.electra`): the generator (the
    first ``generator_layers`` layers' shape, its MLM head at the masked positions) and the discriminator (every
    layer, its detection head, a dense h x h and an h x 1 projection, at every token), forward and backward.
    The sampling of replacements is no matrix product and is not counted."""
    h = config.hidden_size
    generator = encoder_flops_per_token(config, seq_len) * generator_layers / config.num_hidden_layers
    discriminator = encoder_flops_per_token(config, seq_len) + 2 * h * h + 2 * h
    return 3 * (generator + masked_share * mlm_head_flops(config) + discriminator)
