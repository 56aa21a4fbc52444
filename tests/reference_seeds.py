"""Reference implementations transcribed from the five seed notebooks the project grew from.

These are *references* for the tests, not library code: they are copied as faithfully as
possible (their ``np.sqrt``, ``-1e10`` / ``-inf`` / ``-1e6`` fills, ``mask == 0`` conventions,
in-place ``sequence_mask`` and all).  Only outright syntax typos are fixed, and each class is
renamed with its seed number so that several can live in one module.  The tests must never
read the seed files at run time (a user's clone does not have them), hence this module.

Sources:

* seed 000 -- "Multi Head Attention or MHA" notebook: bias-free ``W_q/W_k/W_v``, ``W_o``,
  self-attention only, ``np.sqrt(d_k)`` scale, no mask, returns only the output.
* seed 001 -- Shakib-IO/Python_Practice ``Multi_Head_Attention.ipynb`` (after Hunter Phillips'
  Medium article): ``tokenize``, ``build_vocab``, ``PositionalEncoding`` and
  ``MultiHeadAttention`` (``Wq/Wk/Wv/Wo`` with bias, ``masked_fill(mask == 0, -1e10)``).
  Typo fixed: ``query: torch,Tensor`` -> ``query: torch.Tensor``.
* seed 002 -- a ``src/model.py`` ``MultiHeadAttention`` (``q_proj/k_proj/v_proj/out_proj``,
  ``masked_fill(mask == 0, float("-inf"))``) and its three tests.  The seed calls an undefined
  ``create_causal_mask(n)``; it is ``torch.tril(torch.ones(n, n))`` here.
* seed 003 -- Dive into Deep Learning (d2l.ai, PyTorch) "Multi-Head Attention": the seed's
  ``MultiHeadAttention``, ``transpose_qkv``, ``transpose_output``, plus d2l's published
  ``sequence_mask``, ``masked_softmax`` (fill value ``-1e6``) and ``DotProductAttention`` that the
  seed imports through ``d2l``.
* seed 004 -- an einsum/einops ``MultiHeadAttentionNew`` (Transformer-XL style note): heads
  first layout ``(head, b, l, k)``, ``mask[None]`` filled with ``-np.inf`` where the mask is True
  (True = blocked), dropout(fc(.)) + residual, then LayerNorm.
"""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

# ---------------------------------------------------------------------------------------------
# Seed 000
# ---------------------------------------------------------------------------------------------


class Seed000MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0

        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads

        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, d_model, bias=False)
        self.W_v = nn.Linear(d_model, d_model, bias=False)

        # output projection
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        """
        x : [batch-size, seq_len, d_model]
        """
        batch_size, seq_len, d_model = x.shape

        Q = self.W_q(x)
        K = self.W_k(x)
        V = self.W_v(x)

        Q = Q.view(batch_size, seq_len, self.num_heads, self.d_k).transpose(1, 2)
        K = K.view(batch_size, seq_len, self.num_heads, self.d_k).transpose(1, 2)
        V = V.view(batch_size, seq_len, self.num_heads, self.d_k).transpose(1, 2)

        scores = torch.matmul(Q, K.transpose(-2, -1)) / np.sqrt(self.d_k)
        attention_weights = F.softmax(scores, dim=-1)
        attn_outputs = torch.matmul(attention_weights, V)

        # concatenate heads : [batch_size, seq_len, d_model]
        attn_outputs = attn_outputs.transpose(1, 2).contiguous()
        attn_outputs = attn_outputs.view(batch_size, seq_len, d_model)

        output = self.W_o(attn_outputs)

        return output


# ---------------------------------------------------------------------------------------------
# Seed 001
# ---------------------------------------------------------------------------------------------

SEED001_SEQUENCES = [
    "I wonder what will come next!",
    "This is a basic example paragraph.",
    "Hello, what is a basic split?",
]


def seed001_tokenize(sequence):
    # remove punctuation
    for punc in ["!", ".", "?"]:
        sequence = sequence.replace(punc, "")

    # split the sequence on spaces and lowercase each token
    return [token.lower() for token in sequence.split(" ")]


def seed001_build_vocab(data):
    # Join the sequences into a single string before tokenization
    data_str = " ".join(data)

    # tokenize the data and remove duplicates
    vocab = list(set(seed001_tokenize(data_str)))

    # sort the vocabulary
    vocab.sort()

    # assign an integer to each word
    stoi = {word: i for i, word in enumerate(vocab)}

    return stoi


class Seed001PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_length: int = 5000):
        super().__init__()

        # initialize dropout
        self.dropout = nn.Dropout(p=dropout)

        # create tensor of 0s
        pe = torch.zeros(max_length, d_model)

        # create position column
        k = torch.arange(0, max_length).unsqueeze(1)

        # calc divisor for positional encoding
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))

        # calc sine on even indices
        pe[:, 0::2] = torch.sin(k * div_term)

        # calc cosine on odd indices
        pe[:, 1::2] = torch.cos(k * div_term)

        # add dimension
        pe = pe.unsqueeze(0)

        # buffers are saved in state_dict but not trained by the optimizer
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor):
        # add positional encoding to the embeddings
        x = x + self.pe[:, : x.size(1)].requires_grad_(False)

        # perform dropout
        return self.dropout(x)


class Seed001MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int = 512, n_heads: int = 8, dropout: float = 0.1):
        super().__init__()
        assert d_model % n_heads == 0  # ensure an even num of heads
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_key = d_model // n_heads  # assume d_value equals d_key

        self.Wq = nn.Linear(d_model, d_model)  # query weights
        self.Wk = nn.Linear(d_model, d_model)  # key weights
        self.Wv = nn.Linear(d_model, d_model)  # value weights
        self.Wo = nn.Linear(d_model, d_model)  # output weights

        self.dropout = nn.Dropout(p=dropout)  # initialize dropout layer

    def forward(
        self,
        query: torch.Tensor,  # seed typo fixed: `torch,Tensor`
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor = None,
    ):
        batch_size = key.size(0)

        # calculate query, key, and value tensors
        Q = self.Wq(query)
        K = self.Wk(key)
        V = self.Wv(value)

        # split each tensor into n-heads to compute attention
        Q = Q.view(batch_size, -1, self.n_heads, self.d_key).permute(0, 2, 1, 3)
        K = K.view(batch_size, -1, self.n_heads, self.d_key).permute(0, 2, 1, 3)
        V = V.view(batch_size, -1, self.n_heads, self.d_key).permute(0, 2, 1, 3)

        # scaled dot product -> QK^{T}
        scaled_dot_prod = torch.matmul(Q, K.permute(0, 1, 3, 2)) / math.sqrt(self.d_key)

        # fill those positions of product as (-1e10) where mask positions are 0
        if mask is not None:
            scaled_dot_prod = scaled_dot_prod.masked_fill(mask == 0, -1e10)

        # apply softmax
        attn_probs = torch.softmax(scaled_dot_prod, dim=-1)

        # multiply by values to get attention
        A = torch.matmul(self.dropout(attn_probs), V)

        # reshape attention back to (batch_size, q_length, d_model)
        A = A.permute(0, 2, 1, 3).contiguous()
        A = A.view(batch_size, -1, self.n_heads * self.d_key)

        # push through the final weight layer
        output = self.Wo(A)

        return output, attn_probs


# ---------------------------------------------------------------------------------------------
# Seed 002
# ---------------------------------------------------------------------------------------------


def create_causal_mask(n):
    """Not defined in seed 002; the lower-triangular 1/0 float mask its test implies."""
    return torch.tril(torch.ones(n, n))


class Seed002MultiHeadAttention(nn.Module):
    """Multi-head self-attention mechanism."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.1):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads

        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(self.head_dim)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size, seq_len, _ = x.shape

        # Project to Q, K, V and split into heads
        Q = self.q_proj(x).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        K = self.k_proj(x).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        V = self.v_proj(x).view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

        # Attention scores
        scores = torch.matmul(Q, K.transpose(-2, -1)) / self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))

        attn_weights = F.softmax(scores, dim=-1)
        attn_weights = self.dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, V)

        # Concatenate heads
        attn_output = (
            attn_output.transpose(1, 2).contiguous().view(batch_size, seq_len, self.embed_dim)
        )
        return self.out_proj(attn_output), attn_weights


# ---------------------------------------------------------------------------------------------
# Seed 003 (d2l.ai, PyTorch edition)
# ---------------------------------------------------------------------------------------------


def d2l_sequence_mask(X, valid_len, value=0):
    """Mask irrelevant entries in sequences (d2l.sequence_mask)."""
    maxlen = X.size(1)
    mask = (
        torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    )
    X[~mask] = value
    return X


def d2l_masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis (d2l.masked_softmax)."""
    # `X`: 3D tensor, `valid_lens`: 1D or 2D tensor
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        # On the last axis, replace masked elements with a very large negative
        # value, whose exponentiation outputs 0
        X = d2l_sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class D2LDotProductAttention(nn.Module):
    """Scaled dot product attention (d2l.DotProductAttention)."""

    def __init__(self, dropout, **kwargs):
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)

    # Shape of `queries`: (`batch_size`, no. of queries, `d`)
    # Shape of `keys`: (`batch_size`, no. of key-value pairs, `d`)
    # Shape of `values`: (`batch_size`, no. of key-value pairs, value dimension)
    # Shape of `valid_lens`: (`batch_size`,) or (`batch_size`, no. of queries)
    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        # Set `transpose_b=True` to swap the last two dimensions of `keys`
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = d2l_masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def seed003_transpose_qkv(X, num_heads):
    # (batch_size, no. of queries or key-value pairs, num_hiddens) ->
    # (batch_size, no. of queries or key-value pairs, num_heads, num_hiddens / num_heads)
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)

    # -> (batch_size, num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
    X = X.permute(0, 2, 1, 3)

    # -> (batch_size * num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
    return X.reshape(-1, X.shape[2], X.shape[3])


def seed003_transpose_output(X, num_heads):
    """Reverse the operation of `transpose_qkv`"""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class Seed003MultiHeadAttention(nn.Module):
    def __init__(
        self, key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False
    ):
        super().__init__()
        self.num_heads = num_heads
        self.attention = D2LDotProductAttention(dropout)  # seed: d2l.DotProductAttention
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = seed003_transpose_qkv(self.W_q(queries), self.num_heads)
        keys = seed003_transpose_qkv(self.W_k(keys), self.num_heads)
        values = seed003_transpose_qkv(self.W_v(values), self.num_heads)

        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)

        output = self.attention(queries, keys, values, valid_lens)

        output_concat = seed003_transpose_output(output, self.num_heads)
        return self.W_o(output_concat)


# ---------------------------------------------------------------------------------------------
# Seed 004
# ---------------------------------------------------------------------------------------------


class Seed004MultiHeadAttentionNew(nn.Module):
    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head = n_head

        self.w_qs = nn.Linear(d_model, n_head * d_k)
        self.w_ks = nn.Linear(d_model, n_head * d_k)
        self.w_vs = nn.Linear(d_model, n_head * d_v)

        nn.init.normal_(self.w_qs.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_ks.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_vs.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_v)))

        self.fc = nn.Linear(n_head * d_v, d_model)
        nn.init.xavier_normal_(self.fc.weight)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, q, k, v, mask=None):
        residual = q
        q = rearrange(self.w_qs(q), "b l (head k) -> head b l k", head=self.n_head)
        k = rearrange(self.w_ks(k), "b t (head k) -> head b t k", head=self.n_head)
        v = rearrange(self.w_vs(v), "b t (head v) -> head b t v", head=self.n_head)
        attn = torch.einsum("hblk,hbtk->hblt", [q, k]) / np.sqrt(q.shape[-1])
        if mask is not None:
            attn = attn.masked_fill(mask[None], -np.inf)
        attn = torch.softmax(attn, dim=3)
        output = torch.einsum("hblt,hbtv->hblv", [attn, v])
        output = rearrange(output, "head b l v -> b l (head v)")
        output = self.dropout(self.fc(output))
        output = self.layer_norm(output + residual)
        return output, attn
