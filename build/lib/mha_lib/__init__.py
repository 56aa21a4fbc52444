"""mha_lib: every piece of multi-head attention that the book builds,
step by step."""

__version__ = "0.2.0"

from mha_lib.alibi import alibi_bias
from mha_lib.attention import masked_softmax, scaled_dot_product_attention
from mha_lib.block import TransformerBlock
from mha_lib.cache import KVCache
from mha_lib.gqa import GroupedQueryAttention
from mha_lib.heads import (
    merge_heads,
    split_heads,
    transpose_output,
    transpose_qkv,
)
from mha_lib.interop import (
    from_torch_encoder_layer,
    from_torch_mha,
    to_torch_encoder_layer,
    to_torch_mha,
)
from mha_lib.latent import MultiHeadLatentAttention
from mha_lib.masks import causal_mask, padding_mask, sliding_window_mask
from mha_lib.mha import MultiHeadAttention
from mha_lib.model import TinyTransformer
from mha_lib.positional import PositionalEncoding, sinusoidal_encoding
from mha_lib.rotary import RotaryAttention, apply_rotary
from mha_lib.text import build_vocab, encode, tokenize
from mha_lib.variants import (
    D2LMultiHeadAttention,
    DotProductAttention,
    EinsumMultiHeadAttention,
)

__all__ = [
    "tokenize", "build_vocab", "encode",
    "PositionalEncoding", "sinusoidal_encoding",
    "scaled_dot_product_attention", "masked_softmax",
    "causal_mask", "padding_mask",
    "split_heads", "merge_heads", "transpose_qkv", "transpose_output",
    "MultiHeadAttention",
    "DotProductAttention", "D2LMultiHeadAttention",
    "EinsumMultiHeadAttention",
    "to_torch_mha", "from_torch_mha",
    "GroupedQueryAttention", "KVCache", "TinyTransformer",
    "TransformerBlock",
    "to_torch_encoder_layer", "from_torch_encoder_layer",
    "apply_rotary", "RotaryAttention",
    "sliding_window_mask", "alibi_bias",
    "MultiHeadLatentAttention",
]
