"""d2l's masked softmax and dot-product attention, as published.

From Dive into Deep Learning 1.0 (Zhang et al., 2023), section 11.3,
"Attention Scoring Functions", PyTorch tab: ``masked_softmax`` and
``DotProductAttention`` as the 1.0 text prints them (the edition with
the JAX tab; an earlier draft gave ``DotProductAttention`` ``num_heads``
and ``window_mask`` arguments, which 1.0 does not have). d2l's sample
code, under its licence (LICENSE-SAMPLECODE in
d2l-ai/d2l-en: Copyright 2019 Amazon.com, Inc. or its affiliates,
permission to copy and modify).

Kept here once so that chapters 7 and 9 can run the published code and
compare. It is *not* the library's convention: masked scores become
minus a million, so a query with no valid key gets uniform weights, not
zeros, and ``_sequence_mask`` writes into its input. The library's d2l
variant, in its mask convention, is
:class:`~mha_lib.D2LMultiHeadAttention` (chapter 9).
"""

# ruff: noqa: N803, N806, E501  -- d2l's names (X) and lines, as published

import math

import torch
from torch import nn

__all__ = ["DotProductAttention", "masked_softmax"]


def masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis."""
    # X: 3D tensor, valid_lens: 1D or 2D tensor
    def _sequence_mask(X, valid_len, value=0):
        maxlen = X.size(1)
        mask = torch.arange((maxlen), dtype=torch.float32,
                            device=X.device)[None, :] < valid_len[:, None]
        X[~mask] = value
        return X

    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        # On the last axis, replace masked elements with a very large
        # negative value, whose exponentiation outputs 0
        X = _sequence_mask(X.reshape(-1, shape[-1]), valid_lens,
                           value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot product attention."""
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        # Swap the last two dimensions of keys with keys.transpose(1, 2)
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)
