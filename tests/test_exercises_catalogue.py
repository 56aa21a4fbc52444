"""Every catalogued mistake is planted and refused with its own hint, every
exercise accepts right answers written in at least two styles, and every
section a hint points at is a heading of that chapter's notebook.

``WRONG[checker][mistake]`` is a function that returns the arguments of
the checker with that mistake planted (as a learner would write it;
``mistake/variant`` plants it another way);
``RIGHT[checker]`` lists such functions for right answers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import unicodedata
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import mha_lib
import mha_lib.exercises as exercises
from mha_lib import (
    MultiHeadAttention,
    apply_rotary,
    build_vocab,
    causal_mask,
    encode,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_encoding,
    split_heads,
    tokenize,
)
from mha_lib.attention import masked_softmax
from mha_lib.exercises import SENTENCES
from mha_lib.exercises.chapter15 import SEP, N
from mha_lib.exercises.verdict import CATALOGUE, plain

BOOK = Path(__file__).resolve().parent.parent / "book"
INF = float("-inf")

# --- chapter 1 ------------------------------------------------------------

STOI = build_vocab(SENTENCES, specials=("<pad>",))
TWO = ["What will come next?", "A basic split!"]


def _vocab_unsorted():
    words = []
    for s in SENTENCES:
        words += [t for t in tokenize(s) if t not in words]
    return {w: i for i, w in enumerate(["<pad>", *words])}


def _padded(vocab=STOI, pad=0, left=False):
    rows = [[vocab[t] for t in tokenize(s)] for s in TWO]
    width = max(map(len, rows))
    padding = [[pad] * (width - len(r)) for r in rows]
    ids = [p + r if left else r + p for r, p in zip(rows, padding, strict=True)]
    return torch.tensor(ids), torch.tensor([len(r) for r in rows])


# --- chapter 3 ------------------------------------------------------------

def sinusoidal_power(length, d_model):  # the book's answer
    i = torch.arange(d_model // 2)
    pos = torch.arange(length).unsqueeze(1)  # (L, 1)
    angles = pos / 10000.0 ** (2 * i / d_model)  # (L, d_model/2)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


def sinusoidal_loops(length, d_model):  # plain Python, the formula as read
    return torch.tensor([[math.sin(p / 10000 ** (j / d_model)) if j % 2 == 0
                          else math.cos(p / 10000 ** ((j - 1) / d_model))
                          for j in range(d_model)] for p in range(length)])


def pe_wrong(length, d_model, two=2, divide=True, start=0, layout="pairs"):
    i = torch.arange(0, d_model, 2) if two == 4 else torch.arange(d_model // 2)
    pos = torch.arange(start, start + length).unsqueeze(1)
    power = 10000.0 ** (min(two, 2) * i / d_model)
    angles = pos / power if divide else pos * power
    if layout == "concatenated":
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    pe = torch.zeros(length, d_model)
    first, second = (torch.cos, torch.sin) if layout == "swapped" else (torch.sin, torch.cos)
    pe[:, 0::2], pe[:, 1::2] = first(angles), second(angles)
    return pe


def _pe_column_index(length, d_model):  # 10000 ** (j / d_model), j the column
    j = torch.arange(d_model)
    angles = torch.arange(length)[:, None] / 10000.0 ** (j / d_model)  # (L, d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2], pe[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
    return pe


def _pe_integer_division(length, d_model):  # 2 * i // d_model: always 0
    i = torch.arange(d_model // 2)
    angles = torch.arange(length)[:, None] / 10000.0 ** (2 * i // d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


def shift(k=3, d=8, two=2):  # PE[pos + k] = PE[pos] @ M, rows
    omega = 10000.0 ** (-torch.arange(0, d, 2) * two / 2 / d)
    blocks = [torch.tensor([[torch.cos(w * k), -torch.sin(w * k)],
                            [torch.sin(w * k), torch.cos(w * k)]]) for w in omega]
    return torch.block_diag(*blocks)


def shift_stacked(k=3, d=8):
    angle = k * torch.exp(-math.log(10000.0) * torch.arange(0, d, 2) / d)
    m = torch.zeros(d, d)
    idx = torch.arange(0, d, 2)
    m[idx, idx], m[idx + 1, idx + 1] = angle.cos(), angle.cos()
    m[idx, idx + 1], m[idx + 1, idx] = -angle.sin(), angle.sin()
    return m


def _least_squares_shift():  # fitted on 50 positions: off-block ~1e-5
    pe = sinusoidal_encoding(50, 8)
    return torch.linalg.lstsq(pe[:-3], pe[3:]).solution


def _mixed_shift():
    m = shift()
    m[0, 5] = 0.3
    return m


# --- chapter 4 ------------------------------------------------------------

def qkv_at_once(x, mha):  # the book's answer
    layers = (mha.q_proj, mha.k_proj, mha.v_proj)
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers])
    return (x @ weight.T + bias).chunk(3, dim=-1)


def qkv_linear(x, mha):
    layers = (mha.q_proj, mha.k_proj, mha.v_proj)
    out = F.linear(x, torch.cat([p.weight for p in layers]),
                   torch.cat([p.bias for p in layers]))
    return out.split(mha.d_model, dim=-1)


def _stack(mha, dim=0):
    layers = (mha.q_proj, mha.k_proj, mha.v_proj)
    return (torch.cat([p.weight for p in layers], dim=dim),
            torch.cat([p.bias for p in layers]))


# --- chapter 6 ------------------------------------------------------------

def attention(q, k, v, scale=None, dim=-1, transpose=True):
    scale = q.size(-1) ** -0.5 if scale is None else scale
    keys = k.mT if transpose else k
    weights = torch.softmax(q @ keys * scale, dim=dim)
    return weights @ v, weights


def attention_einsum(q, k, v):
    s = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    w = s.softmax(dim=-1)
    return torch.einsum("...qk,...kv->...qv", w, v), w


def with_tau(scale_of):
    def fn(q, k, v, tau):
        return attention(q, k, v, scale=scale_of(tau, q.size(-1)))
    return fn


def jacobian(scores):
    p = torch.softmax(scores, dim=-1)
    return torch.diag(p) - torch.outer(p, p)


def jacobian_broadcast(scores):
    p = scores.softmax(-1)
    return p[:, None] * (torch.eye(len(p), dtype=p.dtype) - p[None, :])


# --- chapter 7 ------------------------------------------------------------

def mask_from_lengths(lengths, max_len):
    visible = torch.arange(max_len)[None, :] < lengths[:, None]  # (B, Lk)
    return visible[:, None, None, :]


def safe_softmax(scores, mask):
    x = scores.float().masked_fill(~mask, INF)
    empty = ~mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(x.masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(empty, 0.0).to(scores.dtype)


def _after_softmax(scores, mask):  # LLMs-from-scratch 3.5.1's other way
    w = torch.softmax(scores.float(), dim=-1) * mask
    w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    return w.to(scores.dtype)


def _late_zero(scores, mask):  # -1e9, empty rows zeroed after: fine in float32
    w = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    return w.masked_fill(~mask.any(-1, keepdim=True), 0.0)


# --- chapter 8 ------------------------------------------------------------

def _padded_batch():
    torch.manual_seed(8)
    mha = MultiHeadAttention(8, 4).eval()
    x = torch.randn(4, 6, 8)
    return mha, x, torch.tensor([6, 6, 6, 3])


def _mha_output(mask_of, fused=False, whole=False):
    mha, x, lengths = _padded_batch()
    pad, causal = padding_mask(lengths, 6), causal_mask(6)
    with torch.no_grad():
        out = mha(x, mask=mask_of(pad, causal), need_weights=not fused)
    return mha, x, lengths, out if whole else out[0]


# --- chapter 9 ------------------------------------------------------------

def d2l_to_mha(d2l, transpose=False, rename=None, skip=(), bias=None,
               heads=None, copy_bias=True):
    has_bias = d2l.W_q.bias is not None
    mha = MultiHeadAttention(d2l.W_o.out_features,
                             d2l.num_heads if heads is None else heads,
                             bias=has_bias if bias is None else bias)
    pairs = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "out_proj"}
    pairs.update(rename or {})
    with torch.no_grad():
        for old, new in pairs.items():
            if old in skip:
                continue
            source, target = getattr(d2l, old), getattr(mha, new)
            target.weight.copy_(source.weight.T if transpose else source.weight)
            if has_bias and copy_bias and target.bias is not None:
                target.bias.copy_(source.bias)
    return mha


def _d2l_to_mha_8_4(d2l):  # the sizes of the chapter, hard-coded
    mha = MultiHeadAttention(8, 4, bias=d2l.W_q.bias is not None)
    for old, new in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"),
                     ("W_o", "out_proj")):
        getattr(mha, new).load_state_dict(getattr(d2l, old).state_dict())
    return mha


def _d2l_to_mha_shared(d2l):  # d2l's own layers, not copies
    mha = MultiHeadAttention(d2l.W_o.out_features, d2l.num_heads,
                             bias=d2l.W_q.bias is not None)
    mha.q_proj, mha.k_proj = d2l.W_q, d2l.W_k
    mha.v_proj, mha.out_proj = d2l.W_v, d2l.W_o
    return mha


# --- chapter 11 -----------------------------------------------------------

def my_to_torch(m, order="qkv", transpose=False, dim=0, out=True, biases=True,
                batch_first=True, in_bias=True, out_bias=True, per_head=False,
                no_grad=True):
    has_bias = m.q_proj.bias is not None
    t = nn.MultiheadAttention(m.d_model, m.num_heads, bias=has_bias,
                              batch_first=batch_first)
    projs = {"q": m.q_proj, "k": m.k_proj, "v": m.v_proj}
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        weights = [projs[c].weight.T if transpose else projs[c].weight for c in order]
        weight = torch.cat(weights, dim=dim)
        if per_head:  # UvA's qkv_proj rows: (h three d)
            weight = rearrange(weight, "(three h d) i -> (h three d) i", three=3,
                               h=m.num_heads)
        t.in_proj_weight.copy_(weight)
        if out:
            t.out_proj.weight.copy_(m.out_proj.weight)
        if has_bias and biases:
            if in_bias:
                t.in_proj_bias.copy_(torch.cat([projs[c].bias for c in order]))
            if out_bias:
                t.out_proj.bias.copy_(m.out_proj.bias)
    return t


def my_to_torch_unbiased(m):  # bias=False whatever m has
    t = nn.MultiheadAttention(m.d_model, m.num_heads, bias=False, batch_first=True)
    with torch.no_grad():
        t.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight,
                                          m.v_proj.weight]))
        t.out_proj.weight.copy_(m.out_proj.weight)
    return t


def my_to_torch_state(m):
    t = nn.MultiheadAttention(m.d_model, m.num_heads, batch_first=True,
                              bias=m.q_proj.bias is not None)
    state = {"in_proj_weight": torch.cat([m.q_proj.weight, m.k_proj.weight,
                                          m.v_proj.weight]),
             "out_proj.weight": m.out_proj.weight}
    if m.q_proj.bias is not None:
        state["in_proj_bias"] = torch.cat([m.q_proj.bias, m.k_proj.bias,
                                           m.v_proj.bias])
        state["out_proj.bias"] = m.out_proj.bias
    t.load_state_dict(state)
    return t


def torch_masks(valid_lens, length):
    valid = padding_mask(valid_lens, length)[:, 0, 0]
    return ~valid, ~causal_mask(length)


def torch_masks_arange(valid_lens, length):
    pos = torch.arange(length)
    return pos[None, :] >= valid_lens[:, None], pos[None, :] > pos[:, None]


def sdpa(m, x, mask=None, how="right"):
    def project(p):  # a learner's F.linear, with or without the bias
        no_bias = how in ("no_biases", "no_bias_anywhere")
        return F.linear(x, p.weight, None if no_bias else p.bias)

    q, k, v = (split_heads(project(p), m.num_heads) for p in (m.q_proj, m.k_proj, m.v_proj))
    if how == "view_split":  # the heads cut out of the sequence
        q, k, v = (p(x).view(x.size(0), m.num_heads, x.size(1), -1)
                   for p in (m.q_proj, m.k_proj, m.v_proj))
    if how == "inverted":
        mask = ~mask if mask is not None else None
    elif how == "float":
        mask = mask.float() if mask is not None else None
    elif how == "ignored":
        mask = None
    kwargs = {"is_causal": True} if how == "is_causal" else {}
    if how == "d_model_scale":  # 1 / sqrt(d_model): the whole width
        kwargs = {"scale": 1 / math.sqrt(m.d_model)}
    elif how == "length_scale":  # 1 / sqrt(L): a sequence length
        kwargs = {"scale": 1 / math.sqrt(x.size(1))}
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    if how == "right" and mask is not None:  # rows with no key: zeros
        heads = heads.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    if how == "nan":  # a row norm that divides zero by zero
        size = heads.abs().sum(-1, keepdim=True)
        heads = heads / size * size
    if how == "no_transpose":
        return m.out_proj(heads.reshape(x.shape))
    merged = merge_heads(heads)
    if how == "no_out_proj":
        return merged
    if how in ("no_bias_out", "no_bias_anywhere"):
        return merged @ m.out_proj.weight.T
    out = m.out_proj(merged)
    return out.detach() if how == "detached" else out


def sdpa_transpose(m, x, mask=None):
    batch, length, d_model = x.shape
    heads = [p(x).view(batch, length, m.num_heads, -1).transpose(1, 2)
             for p in (m.q_proj, m.k_proj, m.v_proj)]
    out = F.scaled_dot_product_attention(*heads, attn_mask=mask)
    if mask is not None:  # a query with no key: zeros, as m gives
        out = torch.where(mask.any(-1, keepdim=True), out, 0.0)
    return m.out_proj(out.transpose(1, 2).reshape(batch, length, d_model))


# --- chapter 12 -----------------------------------------------------------

def block_params(d, f):
    return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d


def pre_norm(block, x, how="right"):
    def attn(h, kv=None):
        return block.attn(h, kv, kv, need_weights=False)[0]

    def ffn(h, act=True):
        hidden = block.linear1(h)
        return block.linear2(block.activation(hidden) if act else hidden)

    if how == "post":
        x = block.norm1(x + attn(x))
        return block.norm2(x + ffn(x))
    if how == "stream":
        x = block.norm1(x)
        x = x + attn(x)
        x = block.norm2(x)
        return x + ffn(x)
    if how == "no_first":
        a = attn(block.norm1(x))
        return a + ffn(block.norm2(a))
    if how == "pair":
        return block.attn(block.norm1(x)), None
    h = x + attn(block.norm1(x), x if how == "raw_kv" else None)
    if how == "no_second":
        return ffn(block.norm2(h))
    if how == "one_norm":
        return h + ffn(block.norm1(h))
    return h + ffn(block.norm2(h), act=how != "no_activation")


def pre_norm_explicit(block, x):
    n = block.norm1(x)
    x = x + block.attn(n, n, n)[0]
    return x + block.linear2(block.activation(block.linear1(block.norm2(x))))


# --- chapter 13 -----------------------------------------------------------

def tiled_softmax(scores, block_size, rescale=True, second_pass=True, use_max=True):
    blocks = scores.split(block_size, dim=-1)
    m = torch.full_like(scores[..., :1], INF)
    total = torch.zeros_like(m)
    early = []
    for block in blocks:
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True)) if use_max \
            else torch.zeros_like(m)
        scale = torch.exp(m - m_new) if rescale and use_max else 1.0
        total = scale * total + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
        early.append(torch.exp(block - m) / total)
    if not second_pass:
        return torch.cat(early, dim=-1)
    return torch.cat([torch.exp(b - m) / total for b in blocks], dim=-1)


def tiled_softmax_book(scores, block_size):
    blocks = scores.split(block_size, dim=-1)
    m = torch.full_like(scores[..., :1], float("-inf"))
    total = torch.zeros_like(scores[..., :1])
    for block in blocks:
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        total = (torch.exp(m - m_new) * total
                 + torch.exp(block - m_new).sum(dim=-1, keepdim=True))
        m = m_new
    return torch.cat([torch.exp(b - m) / total for b in blocks], dim=-1)


def masked_tiles(q, k, v, mask, block_size, safe=True, fill=INF, scale=None,
                 invert=False, final_where=True):
    scale = q.size(-1) ** -0.5 if scale is None else scale
    mask = ~mask if invert else mask
    outs = []
    for start, q_block in zip(range(0, q.size(-2), block_size),
                              q.split(block_size, dim=-2), strict=True):
        m = q_block.new_full((*q_block.shape[:-1], 1), INF)
        total = torch.zeros_like(m)
        o = q_block.new_zeros((*q_block.shape[:-1], v.size(-1)))
        for key_start, k_block, v_block in zip(
                range(0, k.size(-2), block_size), k.split(block_size, dim=-2),
                v.split(block_size, dim=-2), strict=True):
            tile = mask[start:start + block_size, key_start:key_start + block_size]
            s = (q_block @ k_block.transpose(-2, -1) * scale).masked_fill(~tile, fill)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            base = m_new.masked_fill(m_new == INF, 0.0) if safe else m_new
            p, correction = torch.exp(s - base), torch.exp(m - base)
            total = correction * total + p.sum(dim=-1, keepdim=True)
            o = correction * o + p @ v_block
            m = m_new
        outs.append(torch.where(total > 0, o / total.clamp_min(1e-30), 0.0)
                    if final_where else o / total)
    return torch.cat(outs, dim=-2)


def masked_tiles_book(query, key, value, mask, block_size):
    scale = query.size(-1) ** -0.5
    outputs = []
    for i, q in enumerate(query.split(block_size, dim=-2)):
        r = i * block_size
        m = q.new_full((*q.shape[:-1], 1), float("-inf"))
        total = q.new_zeros((*q.shape[:-1], 1))
        o = q.new_zeros((*q.shape[:-1], value.size(-1)))
        blocks = zip(key.split(block_size, dim=-2),
                     value.split(block_size, dim=-2), strict=True)
        for j, (k, v) in enumerate(blocks):
            c = j * block_size
            tile = mask[r:r + q.size(-2), c:c + k.size(-2)]
            s = (q @ k.mT * scale).masked_fill(~tile, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
            p, correction = torch.exp(s - safe), torch.exp(m - safe)
            total = correction * total + p.sum(dim=-1, keepdim=True)
            o, m = correction * o + p @ v, m_new
        seen = total > 0
        outputs.append(torch.where(seen, o / total.clamp_min(1e-30), 0.0))
    return torch.cat(outputs, dim=-2)


# --- chapter 14 -----------------------------------------------------------

def expand_kv(x, num_heads, how="right"):
    b, h_kv, length, d = x.shape
    g = num_heads // h_kv
    if how == "after_length":
        return x.unsqueeze(3).expand(b, h_kv, length, g, d).reshape(b, num_heads, length, d)
    copies = x.unsqueeze(2).expand(b, h_kv, g, length, d)
    if how == "view":
        return copies.view(b, num_heads, length, d)
    return copies.reshape(b, num_heads, length, d)


def chunk_mask(q_len, past):
    i = torch.arange(q_len).unsqueeze(1)
    j = torch.arange(past + q_len)
    return j <= past + i


# --- chapter 15 -----------------------------------------------------------

def copy_batch(batch_size, generator, how="right"):
    high = 11 if how == "eleven" else 10
    digits = torch.randint(high, (batch_size, N),
                           generator=None if how == "global" else generator)
    sep = torch.full((batch_size, 1), SEP if how != "no_sep" else 0)
    if how == "zeros":
        digits = torch.zeros_like(digits)
    answer = digits.flip(1) if how == "reversed" else digits
    if how == "fresh":
        answer = torch.randint(10, (batch_size, N), generator=generator)
    return torch.cat([digits, sep, answer], dim=1)


def copy_batch_hstack(batch_size, generator):
    d = torch.randint(0, 10, (batch_size, N), generator=generator, dtype=torch.long)
    return torch.hstack([d, torch.full_like(d[:, :1], SEP), d])


def answer_loss(logits, seq, first=N, target=N + 1, reduction="mean"):
    count = min(logits.size(1) - first, seq.size(1) - target)
    return F.cross_entropy(logits[:, first:first + count].flatten(0, 1),
                           seq[:, target:target + count].flatten(),
                           reduction=reduction)


def remove_head(model, head, how="right"):
    if how == "copy":
        model = copy.deepcopy(model)
    blocks = list(model.blocks)[:1] if how == "first" else model.blocks
    for block in blocks:
        d = block.attn.head_dim
        part = slice(head * d, (head + 1) * d)
        if how == "no_grad":
            block.attn.out_proj.weight[:, part] = 0.0
            continue
        with torch.no_grad():
            if how == "rows":
                block.attn.out_proj.weight[part] = 0.0
            elif how == "values":
                block.attn.v_proj.weight[part] = 0.0
            elif how == "query":
                block.attn.q_proj.weight[part] = 0.0
                block.attn.q_proj.bias[part] = 0.0
            else:
                block.attn.out_proj.weight[:, part] = 0.0
    return model if how == "copy" else None


def remove_head_narrow(model, head):
    for block in model.blocks:
        d = block.attn.head_dim
        block.attn.out_proj.weight.data.narrow(1, head * d, d).zero_()


def head_score(weights, k, offset=1):
    num_layers, batch, num_heads, length, _ = weights.shape
    q = torch.arange(length)
    second = (q >= k) & (q < 2 * k - 1)
    target = (q - k + offset).clamp(min=0)
    index = target[None, :, None, :, None].expand(num_layers, batch, num_heads, length, 1)
    on_target = weights.gather(-1, index)[..., 0]
    return (on_target * second[:, None]).sum(dim=(1, 3))


def best(score):
    return divmod(score.argmax().item(), score.size(1))


def induction_loop(weights, k):
    num_layers, _, num_heads, length, _ = weights.shape
    scores = torch.zeros(num_layers, num_heads)
    for b, kb in enumerate(k[:, 0].tolist()):
        for t in range(kb, 2 * kb - 1):
            scores += weights[:, b, :, t, t - kb + 1]
    index = int(scores.flatten().argmax())
    return index // num_heads, index % num_heads


# --- chapter 16 -----------------------------------------------------------

def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_complex(x, positions, base=10000.0, how="right"):
    d = x.size(-1)
    i = torch.arange(0, d, 2) / 2 if how == "exponent_i" else torch.arange(0, d, 2)
    theta = base ** (-i.double() / d)
    if how == "ignored":
        positions = torch.arange(x.size(-2))
    angles = positions.double()[:, None] * theta
    z = torch.view_as_complex(x.double().unflatten(-1, (d // 2, 2)).contiguous())
    rotation = torch.polar(torch.ones_like(angles), angles)
    z = z * (rotation.conj() if how == "conj" else rotation)
    if how == "complex":
        return z
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


def rope_book(x, positions, base=10000.0):
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2).float() / d)
    angles = positions.float()[:, None] * theta
    z = torch.view_as_complex(x.unflatten(-1, (d // 2, 2)).contiguous())
    z = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(z).flatten(-2)


def swap_halves_in_place(x):
    x1, x2 = x.chunk(2, dim=-1)
    x1_old = x1.clone()
    x1.copy_(-x2)
    x2.copy_(x1_old)
    return x


def unturned(head_dim, base, length, turn=2 * math.pi, pairs=None, two=2):
    i = torch.arange((head_dim // 2) if pairs is None else pairs, dtype=torch.float64)
    return int((turn * base ** (two * i / head_dim) > length - 1).sum())


def unturned_loop(head_dim, base, length):
    count = 0
    for i in range(head_dim // 2):
        theta = base ** (-2 * i / head_dim)
        count += 2 * math.pi / theta > length - 1
    return count


# --- chapter 17 -----------------------------------------------------------

def slopes_power_of_two(n):
    return [2 ** (-8 * (i + 1) / n) for i in range(n)]


def slopes(num_heads, extra=slice(0, None, 2)):
    p = 2 ** math.floor(math.log2(num_heads))
    more = slopes_power_of_two(2 * p)[extra][:num_heads - p]
    return slopes_power_of_two(p) + more


def slopes_recursive(n):
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    p = 2 ** math.floor(math.log2(n))
    return slopes_recursive(p) + slopes_recursive(2 * p)[0::2][:n - p]


def slopes_float32(n):
    def power(m):  # float32, torch's default
        return (2.0 ** (-8 * torch.arange(1, m + 1) / m)).tolist()
    p = 2 ** math.floor(math.log2(n))
    return power(p) + power(2 * p)[0::2][:n - p]


# --- chapter 18 -----------------------------------------------------------

def absorb_query(q, w_uk, num_heads):
    return q @ w_uk.unflatten(0, (num_heads, -1))


def absorb_einsum(q, w_uk, num_heads):
    w = rearrange(w_uk, "(h d) c -> h d c", h=num_heads)
    return torch.einsum("bhld,hdc->bhlc", q, w)


def key_projection_eye(m):
    eye = torch.eye(m.kv_down.in_features)
    return m.k_up(m.kv_down(eye)).T


# --- the answers ------------------------------------------------------------

RIGHT = {
    "check_tokenizer": [
        lambda: (lambda t: tokenize(t.replace(",", "")),),
        lambda: (lambda t: [w.lower() for w in re.sub(r"[!.?,]", "", t).split(" ")],),
    ],
    "check_vocab": [
        lambda: (build_vocab(SENTENCES, specials=("<pad>",)),),
        lambda: ({w: i for i, w in enumerate(
            ["<pad>", *sorted({t for s in SENTENCES for t in tokenize(s)})])},),
    ],
    "check_bpe_merges": [
        lambda: ([("u", "g"), ("ug", "</w>"), ("b", "ug</w>")],),
        lambda: ((["u", "g"], ["ug", "</w>"], ["b", "ug</w>"]),),
    ],
    "check_padded_batch": [
        lambda: encode(TWO, STOI, pad_id=0),
        lambda: _padded(),
    ],
    "check_onehot_embedding": [
        lambda: (lambda ids, w: F.one_hot(ids, num_classes=w.size(0)).to(w.dtype) @ w,),
        lambda: (lambda ids, w: torch.einsum(
            "...v,vd->...d", F.one_hot(ids, w.shape[0]).to(w), w),),
    ],
    "check_padding_embedding": [
        lambda: (lambda e: (e, e(encode([*SENTENCES, "What is next?"], STOI,
                                          pad_id=0)[0])))(
            nn.Embedding(15, 8, padding_idx=0)),
        lambda: (lambda e: (e, e.weight[encode([*SENTENCES, "What is next?"], STOI,
                                                pad_id=0)[0]].detach()))(
            nn.Embedding(len(STOI), 8, padding_idx=STOI["<pad>"])),
    ],
    "check_embedding_parameters": [lambda: (50257 * 768,), lambda: (38597376.0,)],
    "check_sinusoidal": [lambda: (sinusoidal_power,), lambda: (sinusoidal_loops,)],
    "check_shift_matrix": [lambda: (shift(),), lambda: (shift_stacked(),),
                           lambda: (_least_squares_shift(),)],
    "check_projection": [
        lambda: (lambda x, w, b: x @ w.T + b,),
        lambda: (lambda x, w, b: torch.matmul(x, w.t()) + b[None, None],),
    ],
    "check_fused_projection": [lambda: (qkv_at_once,), lambda: (qkv_linear,)],
    "check_projection_parameters": [lambda: (3 * (512 * 512 + 512),),
                                    lambda: (787968,)],
    "check_split_heads": [
        lambda: (lambda x, h: x.view(x.size(0), x.size(1), h, -1).permute(0, 2, 1, 3),),
        lambda: (lambda x, h: x.reshape(*x.shape[:2], h, -1).permute(0, 2, 1, 3),),
        lambda: (lambda x, h: rearrange(x, "b l (h d) -> b h l d", h=h),),
        # the chapter's transpose: right values, accepted with a pointer to permute
        lambda: (lambda x, h: x.view(*x.shape[:2], h, -1).transpose(1, 2),),
    ],
    "check_merge_heads": [
        lambda: (lambda x: x.permute(0, 2, 1, 3).reshape(x.size(0), x.size(2), -1),),
        lambda: (lambda x: x.permute(0, 2, 1, 3).contiguous().view(
            x.size(0), x.size(2), -1),),
        lambda: (lambda x: rearrange(x, "b h l d -> b l (h d)"),),
        lambda: (merge_heads,),  # transpose(1, 2): accepted, pointed to permute
        lambda: (lambda x: torch.cat(x.unbind(1), dim=-1),),  # neither
    ],
    "check_head_columns": [
        lambda: (lambda x, h, n: x[..., h * (x.size(-1) // n):(h + 1) * (x.size(-1) // n)],),
        lambda: (lambda x, h, n: x.split(x.size(-1) // n, dim=-1)[h],),
        lambda: (lambda x, h, n: x.narrow(-1, h * (x.size(-1) // n), x.size(-1) // n),),
    ],
    "check_attention": [lambda: (attention,), lambda: (attention_einsum,),
                        lambda: (lambda q, k, v: scaled_dot_product_attention(q, k, v),)],
    "check_temperature": [
        lambda: (with_tau(lambda tau, d: 1 / (tau * math.sqrt(d))),),
        lambda: (lambda q, k, v, tau: scaled_dot_product_attention(
            q / tau, k, v),),
    ],
    "check_softmax_jacobian": [lambda: (jacobian,), lambda: (jacobian_broadcast,)],
    "check_padding_mask": [
        lambda: (mask_from_lengths,),
        lambda: (lambda n, m: (torch.arange(m) < n.unsqueeze(-1)).view(-1, 1, 1, m),),
    ],
    "check_decoder_mask": [
        lambda: (lambda n: padding_mask(n) & causal_mask(int(n.max())),),
        lambda: (lambda n: (torch.arange(int(n.max()))[None, None, None, :]
                            <= torch.arange(int(n.max()))[None, None, :, None])
                 & (torch.arange(int(n.max())) < n[:, None])[:, None, None, :],),
    ],
    "check_safe_softmax": [lambda: (safe_softmax,), lambda: (masked_softmax,)],
    "check_concat_heads": [lambda: (lambda hs: torch.cat(hs, dim=-1),),
                           lambda: (lambda hs: torch.cat(list(hs), dim=2),)],
    "check_masked_self_attention": [
        lambda: _mha_output(lambda p, c: p & c),
        lambda: _mha_output(lambda p, c: p & c, fused=True),
    ],
    "check_num_parameters": [
        lambda: (lambda d, h, bias: 4 * d * d + (4 * d if bias else 0),),
        lambda: (lambda d, h, bias: 4 * (d * d + d * bias),),
    ],
    "check_repeat_lens": [
        lambda: (lambda v, h: v.unsqueeze(1).expand(-1, h, *v.shape[1:]).reshape(
            -1, *v.shape[1:]),),
        lambda: (lambda v, h: v[torch.arange(len(v) * h) // h],),
    ],
    "check_unfold_weights": [
        lambda: (lambda w, h: w.reshape(-1, h, *w.shape[1:]),),
        lambda: (lambda w, h: w.view(w.size(0) // h, h, w.size(1), w.size(2)),),
    ],
    "check_d2l_to_mha": [lambda: (d2l_to_mha,), lambda: (lambda d: d2l_to_mha(d),)],
    "check_einsum_scores": [
        lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k) / math.sqrt(q.shape[-1]),),
        lambda: (lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k) * q.size(-1) ** -0.5,),
    ],
    "check_einops_mask": [
        lambda: (lambda n, length: ~(mha_lib.padding_mask(n, length)[:, 0]
                                     & mha_lib.causal_mask(length)),),
        lambda: (lambda n, length: ~padding_mask(n, length).squeeze(1)
                 | ~causal_mask(length),),
    ],
    "check_einsum_num_parameters": [
        lambda: (lambda h, d, dk, dv: 2 * (d * h * dk + h * dk) + d * h * dv + h * dv
                 + h * dv * d + d + 2 * d,),
        lambda: (lambda h, d, dk, dv: (d + 1) * h * (2 * dk + dv) + (h * dv + 1) * d
                 + 2 * d,),
    ],
    "check_to_torch": [lambda: (my_to_torch,), lambda: (my_to_torch_state,)],
    "check_torch_masks": [lambda: (torch_masks,), lambda: (torch_masks_arange,)],
    "check_sdpa_attention": [lambda: (sdpa,), lambda: (sdpa_transpose,)],
    "check_block_params": [
        lambda: (block_params,),
        lambda: (lambda d, f: sum(p.numel() for p in mha_lib.TransformerBlock(
            d, 1, f).parameters()),),
    ],
    "check_pre_norm": [lambda: (pre_norm,), lambda: (pre_norm_explicit,)],
    "check_weights_mib": [
        lambda: (lambda b, length, h, dtype: b * h * length ** 2
                 * (torch.finfo(dtype).bits // 8) / 2 ** 20,),
        lambda: (lambda b, length, h, dtype: b * h * length * length
                 * torch.empty((), dtype=dtype).element_size() / 1024 / 1024,),
    ],
    "check_tiled_softmax": [lambda: (tiled_softmax,), lambda: (tiled_softmax_book,)],
    "check_masked_tiles": [lambda: (masked_tiles,), lambda: (masked_tiles_book,)],
    "check_cache_bytes": [
        lambda: (lambda n, h, d, length, b, s: 2 * n * h * d * length * b * s,),
        lambda: (lambda *args: 2 * math.prod(args),),
    ],
    "check_expand_kv": [
        lambda: (expand_kv,),
        lambda: (lambda x, h: x[:, :, None].expand(-1, -1, h // x.size(1), -1, -1)
                 .flatten(1, 2),),
    ],
    "check_chunk_mask": [
        lambda: (chunk_mask,),
        lambda: (lambda q, p: torch.arange(p + q)[None, :] - torch.arange(q)[:, None] <= p,),
    ],
    "check_copy_batch": [lambda: (copy_batch,), lambda: (copy_batch_hstack,)],
    "check_answer_loss": [
        lambda: (answer_loss,),
        lambda: (lambda logits, seq: F.cross_entropy(logits[:, N:].transpose(1, 2),
                                                      seq[:, N + 1:]),),
    ],
    "check_remove_head": [lambda: (remove_head,), lambda: (remove_head_narrow,)],
    "check_find_induction_head": [lambda: (lambda w, k: best(head_score(w, k)),),
                                  lambda: (induction_loop,)],
    "check_rotate_half": [
        lambda: (rotate_half,),
        lambda: (lambda x: torch.cat((-x[..., x.size(-1) // 2:],
                                      x[..., :x.size(-1) // 2]), dim=-1),),
    ],
    "check_rotary_complex": [lambda: (rope_complex,), lambda: (rope_book,)],
    "check_unturned_pairs": [lambda: (unturned,), lambda: (unturned_loop,)],
    "check_alibi_slopes": [lambda: (slopes,), lambda: (slopes_recursive,),
                           lambda: (slopes_float32,),
                           lambda: (lambda n: torch.tensor(slopes(n)),)],
    "check_absorbed_query": [lambda: (absorb_query,), lambda: (absorb_einsum,)],
    "check_latent_cache_bytes": [
        lambda: (lambda c, r, length, b, s: (c + r) * length * b * s,),
        lambda: (lambda *args: (args[0] + args[1]) * math.prod(args[2:]),),
    ],
    "check_key_projection": [
        lambda: (lambda m: m.k_up.weight @ m.kv_down.weight,),
        lambda: (key_projection_eye,),
    ],
}


def _sentences_vocab(**kw):
    return build_vocab([s.replace(",", "") for s in SENTENCES], specials=("<pad>",))


def _zeroed_embedding():
    e = nn.Embedding(15, 8)
    with torch.no_grad():
        e.weight[0] = 0.0
    ids = encode([*SENTENCES, "What is next?"], STOI, pad_id=0)[0]
    return e, e(ids)


def _embedding(num=15, padding_idx=0, ids_of=None, other=False):
    e = nn.Embedding(num, 8, padding_idx=padding_idx)
    ids = encode([*SENTENCES, "What is next?"], STOI, pad_id=0)[0]
    ids = ids_of(ids) if ids_of else ids
    table = nn.Embedding(num, 8, padding_idx=padding_idx) if other else e
    return e, table(ids.clamp(max=num - 1))


WRONG = {
    "check_tokenizer": {
        "comma_kept": lambda: (tokenize,),
        "empty_token": lambda: (lambda t: tokenize(t.replace(",", " ")),),
        "not_lowercase": lambda: (lambda t: re.sub(r"[!.?,]", "", t).split(" "),),
        "too_much_removed": lambda: (lambda t: re.findall(r"\w+", t.lower()),),
        "inner_comma": lambda: (lambda t: [w.rstrip(",") for w in tokenize(t)],),
        "inner_period": lambda: (lambda t: [
            w.strip(",.!?").lower() for w in t.split(" ")],),
        "inner_period/strip_after_comma": lambda: (lambda t: [
            w.strip(".!?").lower() for w in t.replace(",", "").split(" ")],),
    },
    "check_bpe_merges": {
        "joined": lambda: (["ug", "ug</w>", "bug</w>"],),
        "no_end_marker": lambda: ([("u", "g"), ("b", "ug"), ("p", "ug")],),
        "unweighted": lambda: ([("u", "g"), ("ug", "</w>"), ("p", "ug</w>")],),
        "not_recounted": lambda: ([("u", "g"), ("g", "</w>"), ("b", "u")],),
        "wrong_order": lambda: ([("ug", "</w>"), ("u", "g"), ("b", "ug</w>")],),
    },
    "check_vocab": {
        "no_pad": lambda: (build_vocab(SENTENCES),),
        "pad_last": lambda: ({**build_vocab(SENTENCES), "<pad>": 14},),
        "shared_id": lambda: ({**build_vocab(SENTENCES), "<pad>": 0},),
        "unsorted": lambda: (_vocab_unsorted(),),
        "commas": lambda: (_sentences_vocab(),),
    },
    "check_padded_batch": {
        "pad_id": lambda: _padded(pad=-1),
        "no_pad_vocab": lambda: _padded(build_vocab(SENTENCES)),
        "padded_lengths": lambda: (_padded()[0], torch.tensor([4, 4])),
        "left_padding": lambda: _padded(left=True),
    },
    "check_onehot_embedding": {
        "indexing": lambda: (lambda ids, w: w[ids],),
        "no_num_classes": lambda: (lambda ids, w: F.one_hot(ids).float() @ w,),
        "not_cast": lambda: (lambda ids, w: F.one_hot(ids, w.size(0)) @ w,),
        "classes_d_model": lambda: (lambda ids, w: F.one_hot(
            ids, w.size(1)).float() @ w,),
        "transposed": lambda: (lambda ids, w: F.one_hot(
            ids, w.size(0)).float() @ w.T,),
        "no_gradient": lambda: (lambda ids, w: (
            F.one_hot(ids, w.size(0)).float() @ w).detach(),),
        "no_one_hot": lambda: (lambda ids, w: (
            ids[..., None] == torch.arange(w.size(0))).float() @ w,),
    },
    "check_padding_embedding": {
        "no_padding_idx": lambda: _embedding(padding_idx=None),
        "zeroed_by_hand": _zeroed_embedding,
        "vocab_without_pad": lambda: _embedding(num=14),
        "three_sentences": lambda: _embedding(ids_of=lambda ids: ids[:3]),
        "other_table": lambda: _embedding(other=True),
    },
    "check_embedding_parameters": {
        "bias": lambda: (50257 * 768 + 768,),
        "bytes": lambda: (4 * 50257 * 768,),
        "tied_twice": lambda: (2 * 50257 * 768,),
        "whole_model": lambda: (124_412_160,),
        "with_positions": lambda: (50257 * 768 + 1024 * 768,),
    },
    "check_sinusoidal": {
        "exp_log": lambda: (sinusoidal_encoding,),
        "concatenated": lambda: (lambda n, d: pe_wrong(n, d, layout="concatenated"),),
        "swapped": lambda: (lambda n, d: pe_wrong(n, d, layout="swapped"),),
        "exponent_i": lambda: (lambda n, d: pe_wrong(n, d, two=1),),
        "exponent_4i": lambda: (lambda n, d: pe_wrong(n, d, two=4),),
        "multiplied": lambda: (lambda n, d: pe_wrong(n, d, divide=False),),
        "from_one": lambda: (lambda n, d: pe_wrong(n, d, start=1),),
        "column_index": lambda: (_pe_column_index,),
        "integer_division": lambda: (_pe_integer_division,),
    },
    "check_shift_matrix": {
        "backwards": lambda: (shift().T,),
        "one_step": lambda: (shift(k=1),),
        "exponent_i": lambda: (shift(two=1),),
        "not_block_diagonal": lambda: (_mixed_shift(),),
    },
    "check_projection": {
        "not_transposed": lambda: (lambda x, w, b: x @ w + b,),
        "no_bias": lambda: (lambda x, w, b: x @ w.T,),
        "not_at": lambda: (lambda x, w, b: F.linear(x, w, b),),
        "view": lambda: (lambda x, w, b: (x.view(-1, x.size(-1)) @ w.T + b).view(
            *x.shape[:-1], -1),),
    },
    "check_fused_projection": {
        "three_products": lambda: (lambda x, m: (m.q_proj(x), m.k_proj(x), m.v_proj(x)),),
        "no_bias": lambda: (lambda x, m: (x @ _stack(m)[0].T).chunk(3, dim=-1),),
        "order": lambda: (lambda x, m: (lambda q, k, v: (q, v, k))(*qkv_at_once(x, m)),),
        "wrong_axis": lambda: (lambda x, m: (x @ _stack(m, dim=1)[0].T
                                             + _stack(m)[1]).chunk(3, -1),),
        "split_axis": lambda: (lambda x, m: (x @ _stack(m)[0].T + _stack(m)[1]).chunk(
            3, dim=1),),
        "no_gradient": lambda: (lambda x, m: tuple(t.detach() for t in qkv_at_once(x, m)),),
        "fixed_size/reshape": lambda: (lambda x, m: (x @ torch.stack(
            [p.weight for p in (m.q_proj, m.k_proj, m.v_proj)]).reshape(24, 8).T
            + _stack(m)[1]).chunk(3, dim=-1),),
        "fixed_size/split": lambda: (lambda x, m: (x @ _stack(m)[0].T + _stack(m)[1]).split(
            8, dim=-1),),
    },
    "check_projection_parameters": {
        "no_bias": lambda: (3 * 512 * 512,),
        "with_output": lambda: (4 * (512 * 512 + 512),),
        "per_head": lambda: (3 * (512 * 64 + 64),),
        "one_layer": lambda: (512 * 512 + 512,),
        "times_heads": lambda: (8 * 3 * (512 * 512 + 512),),
        "fixed_head_width": lambda: (3 * (512 * 1024 + 1024),),
    },
    "check_split_heads": {
        "plain_view": lambda: (lambda x, h: x.view(x.size(0), h, x.size(1), -1),),
        "no_swap": lambda: (lambda x, h: x.view(*x.shape[:2], h, -1),),
        "strided": lambda: (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2),),
        "wrong_permute": lambda: (lambda x, h: x.view(*x.shape[:2], h, -1).permute(
            0, 2, 3, 1),),
        "wrong_transpose": lambda: (lambda x, h: x.view(*x.shape[:2], h, -1).transpose(
            2, 3),),
    },
    "check_merge_heads": {
        "view_not_contiguous": lambda: (lambda x: x.transpose(1, 2).view(
            x.size(0), x.size(2), -1),),
        "reshape_only": lambda: (lambda x: x.reshape(x.size(0), x.size(2), -1),),
        "dimension_major": lambda: (lambda x: x.permute(0, 2, 3, 1).reshape(
            x.size(0), x.size(2), -1),),
    },
    "check_head_columns": {
        "strided": lambda: (lambda x, h, n: x[..., h::n],),
        "width_is_heads": lambda: (lambda x, h, n: x[..., h * n:(h + 1) * n],),
        "one_too_many": lambda: (lambda x, h, n: x[
            ..., h * (x.size(-1) // n):(h + 1) * (x.size(-1) // n) + 1],),
        "reshaped": lambda: (lambda x, h, n: split_heads(x, n)[:, h],),
        "wrong_split": lambda: (lambda x, h, n: x.view(
            x.size(0), n, x.size(1), -1)[:, h],),
    },
    "check_attention": {
        "unscaled": lambda: (lambda q, k, v: attention(q, k, v, scale=1.0),),
        "scaled_by_dk": lambda: (lambda q, k, v: attention(q, k, v, scale=1 / q.size(-1)),),
        "scaled_by_dv": lambda: (lambda q, k, v: attention(q, k, v, scale=v.size(-1) ** -0.5),),
        "scaled_by_length": lambda: (lambda q, k, v: attention(
            q, k, v, scale=k.size(-2) ** -0.5),),
        "multiplied": lambda: (lambda q, k, v: attention(q, k, v, scale=q.size(-1) ** 0.5),),
        "softmax_dim": lambda: (lambda q, k, v: attention(q, k, v, dim=-2),),
        "k_not_transposed": lambda: (lambda q, k, v: attention(q, k, v, transpose=False),),
        "dot_T": lambda: (lambda q, k, v: (lambda w: (w @ v, w))(
            torch.softmax(q @ k.T / math.sqrt(q.size(-1)), -1)),),
        "swapped_qk": lambda: (lambda q, k, v: attention(k, q, v),),
        "swapped_pair": lambda: (lambda q, k, v: attention(q, k, v)[::-1],),
        "no_gradient": lambda: (lambda q, k, v: tuple(t.detach() for t in attention(q, k, v)),),
    },
    "check_temperature": {
        "multiplied_by_tau": lambda: (with_tau(lambda tau, d: tau / math.sqrt(d)),),
        "tau_ignored": lambda: (with_tau(lambda tau, d: 1 / math.sqrt(d)),),
        "sqrt_of_tau": lambda: (with_tau(lambda tau, d: 1 / math.sqrt(tau * d)),),
        "no_sqrt_d": lambda: (with_tau(lambda tau, d: 1 / tau),),
        "softmax_dim": lambda: (lambda q, k, v, tau: attention(
            q, k, v, scale=1 / (tau * math.sqrt(q.size(-1))), dim=-2),),
    },
    "check_softmax_jacobian": {
        "autograd": lambda: (lambda s: torch.autograd.functional.jacobian(
            lambda x: x.softmax(-1), s),),
        "diagonal_only": lambda: (lambda s: torch.diag(s.softmax(-1)),),
        "sign": lambda: (lambda s: -jacobian(s),),
        "no_diagonal": lambda: (lambda s: -torch.outer(s.softmax(-1), s.softmax(-1)),),
        "of_scores": lambda: (lambda s: torch.diag(s) - torch.outer(s, s),),
        "elementwise": lambda: (lambda s: torch.diag(s.softmax(-1)) - s.softmax(-1) ** 2,),
    },
    "check_padding_mask": {
        "library": lambda: (padding_mask,),
        "inverted": lambda: (lambda n, m: ~mask_from_lengths(n, m),),
        "one_too_many": lambda: (lambda n, m: (torch.arange(m) <= n[:, None])[:, None, None],),
        "no_broadcast_axes": lambda: (lambda n, m: torch.arange(m) < n[:, None],),
        "keys_on_query_axis": lambda: (lambda n, m: (
            torch.arange(m) < n[:, None])[:, None, :, None],),
        "longest_length": lambda: (lambda n, m: mask_from_lengths(n, int(n.max())),),
        "not_bool": lambda: (lambda n, m: mask_from_lengths(n, m).long(),),
    },
    "check_decoder_mask": {
        "padding_only": lambda: (lambda n: padding_mask(n).expand(
            -1, 1, int(n.max()), -1),),
        "causal_only": lambda: (lambda n: causal_mask(int(n.max())).expand(
            len(n), 1, -1, -1),),
        "either": lambda: (lambda n: padding_mask(n) | causal_mask(int(n.max())),),
        "inverted": lambda: (lambda n: ~(padding_mask(n) & causal_mask(int(n.max()))),),
        "future": lambda: (lambda n: padding_mask(n) & causal_mask(int(n.max())).T,),
        "no_diagonal": lambda: (lambda n: padding_mask(n) & torch.ones(
            int(n.max()), int(n.max()), dtype=torch.bool).tril(-1),),
        "pad_queries": lambda: (lambda n: padding_mask(n).transpose(-1, -2)
                                & causal_mask(int(n.max())),),
        "no_head_axis": lambda: (lambda n: (padding_mask(n) & causal_mask(
            int(n.max())))[:, 0],),
    },
    "check_safe_softmax": {
        "finite_fill": lambda: (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1),),
        "nan": lambda: (lambda s, m: torch.softmax(s.masked_fill(~m, INF), -1),),
        "half_overflow": lambda: (_late_zero,),
        "dtype": lambda: (lambda s, m: safe_softmax(s.float(), m),),
        "inverted": lambda: (lambda s, m: safe_softmax(s, ~m),),
        "after_softmax": lambda: (_after_softmax,),
        "softmax_dim": lambda: (lambda s, m: safe_softmax(s.float().mT, m.mT).mT.to(
            s.dtype),),
    },
    "check_concat_heads": {
        "wrong_axis": lambda: (lambda hs: torch.cat(hs, dim=0),),
        "interleaved": lambda: (lambda hs: torch.stack(hs, dim=-1).flatten(-2),),
        "reversed": lambda: (lambda hs: torch.cat(hs[::-1], dim=-1),),
        "no_transpose": lambda: (lambda hs: torch.stack(hs, dim=1).reshape(
            hs[0].shape[0], hs[0].shape[1], -1),),
        "view": lambda: (lambda hs: torch.stack(hs, dim=1).transpose(1, 2).view(
            hs[0].shape[0], hs[0].shape[1], -1),),
    },
    "check_masked_self_attention": {
        "padding_only": lambda: _mha_output(lambda p, c: p),
        "causal_only": lambda: _mha_output(lambda p, c: c),
        "either": lambda: _mha_output(lambda p, c: p | c),
        "inverted": lambda: _mha_output(lambda p, c: ~(p & c)),
        "no_mask": lambda: _mha_output(lambda p, c: None),
        "future": lambda: _mha_output(lambda p, c: p & c.mT),
        "future/alone": lambda: _mha_output(lambda p, c: torch.ones(
            6, 6, dtype=torch.bool).triu()),
        "pair": lambda: _mha_output(lambda p, c: p & c, whole=True),
        "off_by_one": lambda: _mha_output(lambda p, c: p & c.tril(-1)),
        "off_by_one/alone": lambda: _mha_output(lambda p, c: torch.ones(
            6, 6, dtype=torch.bool).tril(-1)),
    },
    "check_num_parameters": {
        "no_bias": lambda: (lambda d, h, bias: 4 * d * d,),
        "bias_flag": lambda: (lambda d, h, bias: 4 * d * d + 4 * d,),
        "three_biases": lambda: (lambda d, h, bias: 4 * d * d + 3 * d * bias,),
        "float_count": lambda: (lambda d, h, bias: 4.0 * d * d + 4.0 * d * bias,),
        "no_output": lambda: (lambda d, h, bias: 3 * d * d + 3 * d * bias,),
        "per_head": lambda: (lambda d, h, bias: 4 * d * (d // h) + 4 * (d // h) * bias,),
        "head_matrices": lambda: (lambda d, h, bias: 4 * h * d * d + 4 * d * bias,),
        "head_matrices/out_shared": lambda: (lambda d, h, bias: h * 3 * d * d + d * d
                                             + 4 * d * bias,),
        "head_squares": lambda: (lambda d, h, bias: 4 * h * (d // h) ** 2
                                 + 4 * d * bias,),
        "built_module": lambda: (lambda d, h, bias: sum(
            p.numel() for p in MultiHeadAttention(d, h, bias=bias).parameters()),),
    },
    "check_repeat_lens": {
        "tiled": lambda: (lambda v, h: v.repeat(h, *[1] * (v.dim() - 1)),),
        # written for (B,) lengths: fails on (B, Lq)
        "one_d_only": lambda: (lambda v, h: v[:, None].expand(-1, h).reshape(-1),),
        "copying": lambda: (lambda v, h: torch.repeat_interleave(v, h, dim=0),),
        # concatenated copies: right numbers, but not indexing, expand or reshape
        "copying/cat": lambda: (lambda v, h: torch.stack([v] * h, dim=1).reshape(
            -1, *v.shape[1:]),),
        "head_axis_last": lambda: (lambda v, h: v[..., None].expand(*v.shape, h).reshape(
            -1, *v.shape[1:]),),
        "flattened": lambda: (lambda v, h: v.unsqueeze(1).expand(
            -1, h, *v.shape[1:]).reshape(-1),),
    },
    "check_unfold_weights": {
        "head_major": lambda: (lambda w, h: w.reshape(h, -1, *w.shape[1:]).transpose(0, 1),),
        "swapped_lengths": lambda: (lambda w, h: w.reshape(-1, h, w.size(2), w.size(1)),),
        "transposed": lambda: (lambda w, h: w.reshape(-1, h, *w.shape[1:]).mT,),
    },
    "check_d2l_to_mha": {
        "transposed": lambda: (lambda d: d2l_to_mha(d, transpose=True),),
        "swapped": lambda: (lambda d: d2l_to_mha(d, rename={"W_q": "k_proj",
                                                             "W_k": "q_proj"}),),
        "not_copied": lambda: (lambda d: d2l_to_mha(d, skip=("W_o",)),),
        "extra_bias": lambda: (lambda d: d2l_to_mha(d, bias=True),),
        "bias_not_copied": lambda: (lambda d: d2l_to_mha(d, copy_bias=False),),
        "num_heads": lambda: (lambda d: d2l_to_mha(d, heads=1),),
        "hard_coded": lambda: (_d2l_to_mha_8_4,),
        "shared": lambda: (_d2l_to_mha_shared,),
    },
    "check_einsum_scores": {
        "unscaled": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k),),
        "scaled_by_d": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k)
                                / q.size(-1),),
        "multiplied": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k)
                               * q.size(-1) ** 0.5,),
        "scaled_by_d_model": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k)
                                      / (q.size(1) * q.size(-1)) ** 0.5,),
        "keys_first": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhtl", q, k)
                               / q.size(-1) ** 0.5,),
        "not_one_einsum": lambda: (lambda q, k: q @ k.mT / q.size(-1) ** 0.5,),
        "scaled_by_length": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k)
                                     / math.sqrt(k.size(-2)),),
        "scaled_by_length/queries": lambda: (
            lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k) / math.sqrt(q.shape[2]),),
        "scaled_by_heads": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k)
                                    / math.sqrt(q.size(1)),),
        "heads_summed": lambda: (lambda q, k: torch.einsum("bhld,bgtd->bhlt", q, k)
                                 / math.sqrt(q.size(-1)),),
        "zeros": lambda: (lambda q, k: torch.einsum("bhld,bhtd->bhlt", q, k * 0),),
        "key_letter": lambda: (lambda q, k: torch.einsum("bhld,bhld->bhl", q, k)
                               / math.sqrt(q.size(-1)),),
        "softmaxed": lambda: (lambda q, k: (torch.einsum("bhld,bhtd->bhlt", q, k)
                                            / math.sqrt(q.size(-1))).softmax(-1),),
    },
    "check_einops_mask": {
        "library_convention": lambda: (lambda n, length: padding_mask(n, length)[:, 0]
                                       & causal_mask(length),),
        "padding_only": lambda: (lambda n, length: ~padding_mask(n, length)[:, 0].expand(
            -1, length, -1),),
        "causal_only": lambda: (lambda n, length: (~causal_mask(length)).expand(
            len(n), -1, -1),),
        "half_inverted": lambda: (lambda n, length: ~padding_mask(n, length)[:, 0]
                                  & causal_mask(length),),
        "blocked_only_if_both": lambda: (lambda n, length: ~padding_mask(n, length)[:, 0]
                                         & ~causal_mask(length),),
        "head_axis": lambda: (lambda n, length: ~(padding_mask(n, length)
                                                  & causal_mask(length)),),
        "not_from_library": lambda: (lambda n, length: (
            torch.arange(length)[None, None, :] >= n[:, None, None])
            | (torch.arange(length)[None, :] > torch.arange(length)[:, None]),),
    },
    "check_einsum_num_parameters": {
        "no_layer_norm": lambda: (lambda h, d, dk, dv: (d + 1) * h * (2 * dk + dv)
                                  + (h * dv + 1) * d,),
        "no_biases": lambda: (lambda h, d, dk, dv: d * h * (2 * dk + dv) + h * dv * d
                              + 2 * d,),
        "d_k_d_v_swapped": lambda: (lambda h, d, dk, dv: (d + 1) * h * (2 * dv + dk)
                                    + (h * dk + 1) * d + 2 * d,),
        "square_fc": lambda: (lambda h, d, dk, dv: (d + 1) * h * (2 * dk + dv)
                              + (d + 1) * d + 2 * d,),
        "values_d_k": lambda: (lambda h, d, dk, dv: (d + 1) * h * 3 * dk
                               + (h * dk + 1) * d + 2 * d,),
        "queries_keys_d_v": lambda: (lambda h, d, dk, dv: (d + 1) * h * 3 * dv
                                     + (h * dv + 1) * d + 2 * d,),
        "d_model_short": lambda: (lambda h, d, dk, dv: (d + 1) * h * (2 * dk + dv)
                                  + h * dv * d + 2 * d,),  # fc without its bias
        "d_model_short/norm_weight": lambda: (
            lambda h, d, dk, dv: (d + 1) * h * (2 * dk + dv) + (h * dv + 1) * d + d,),
        "no_projection_biases": lambda: (lambda h, d, dk, dv: d * h * (2 * dk + dv)
                                         + (h * dv + 1) * d + 2 * d,),
        "chapter8_sizes": lambda: (lambda h, d, dk, dv: 4 * (d * d + d) + 2 * d,),
    },
    "check_to_torch": {
        "order": lambda: (lambda m: my_to_torch(m, order="kqv"),),
        "transposed": lambda: (lambda m: my_to_torch(m, transpose=True),),
        "stacked_wrong_axis": lambda: (lambda m: my_to_torch(m, dim=1),),
        "out_proj": lambda: (lambda m: my_to_torch(m, out=False),),
        "biases": lambda: (lambda m: my_to_torch(m, biases=False),),
        "batch_first": lambda: (lambda m: my_to_torch(m, batch_first=False),),
        "library": lambda: (lambda m: mha_lib.to_torch_mha(m),),
        "made_without_bias": lambda: (lambda m: my_to_torch_unbiased(m),),
        "in_proj_bias": lambda: (lambda m: my_to_torch(m, in_bias=False),),
        "out_proj_bias": lambda: (lambda m: my_to_torch(m, out_bias=False),),
        "per_head": lambda: (lambda m: my_to_torch(m, per_head=True),),
        "no_grad": lambda: (lambda m: my_to_torch(m, no_grad=False),),
    },
    "check_torch_masks": {
        "padding_polarity": lambda: (lambda n, length: (
            padding_mask(n, length)[:, 0, 0], ~causal_mask(length)),),
        "causal_polarity": lambda: (lambda n, length: (
            ~padding_mask(n, length)[:, 0, 0], causal_mask(length)),),
        "padding_shape": lambda: (lambda n, length: (
            ~padding_mask(n, length), ~causal_mask(length)),),
        "batched_attn_mask": lambda: (lambda n, length: (
            torch_masks(n, length)[0], torch_masks(n, length)[1].expand(len(n), -1, -1)),),
        "swapped": lambda: (lambda n, length: torch_masks(n, length)[::-1],),
        "diagonal": lambda: (lambda n, length: (
            torch_masks(n, length)[0], torch.ones(length, length, dtype=torch.bool).triu()),),
        "float_mask": lambda: (lambda n, length: (
            ~padding_mask(n, length)[:, 0, 0].float(), ~causal_mask(length)),),
        "float_mask/zero_one": lambda: (lambda n, length: (
            1 - padding_mask(n, length)[:, 0, 0].float(), ~causal_mask(length)),),
    },
    "check_sdpa_attention": {
        "inverted": lambda: (lambda m, x, mask: sdpa(m, x, mask, "inverted"),),
        "float_mask": lambda: (lambda m, x, mask: sdpa(m, x, mask, "float"),),
        "mask_ignored": lambda: (lambda m, x, mask: sdpa(m, x, mask, "ignored"),),
        "is_causal": lambda: (lambda m, x, mask: sdpa(m, x, None, "is_causal"),),
        "no_out_proj": lambda: (lambda m, x, mask: sdpa(m, x, mask, "no_out_proj"),),
        "no_transpose": lambda: (lambda m, x, mask: sdpa(m, x, mask, "no_transpose"),),
        "view_split": lambda: (lambda m, x, mask: sdpa(m, x, mask, "view_split"),),
        "nan_row": lambda: (lambda m, x, mask: sdpa(m, x, mask, "nan"),),
        "no_sdpa": lambda: (lambda m, x, mask: m(x, mask=mask, need_weights=False)[0],),
        "no_gradient": lambda: (lambda m, x, mask: sdpa(m, x, mask, "detached"),),
        "no_biases": lambda: (lambda m, x, mask: sdpa(m, x, mask, "no_biases"),),
        "no_biases/anywhere": lambda: (
            lambda m, x, mask: sdpa(m, x, mask, "no_bias_anywhere"),),
        "no_out_bias": lambda: (lambda m, x, mask: sdpa(m, x, mask, "no_bias_out"),),
        "scaled_by_d_model": lambda: (lambda m, x, mask: sdpa(m, x, mask, "d_model_scale"),),
        "scaled_by_length": lambda: (lambda m, x, mask: sdpa(m, x, mask, "length_scale"),),
    },
    "check_block_params": {
        "four_d_missing": lambda: (lambda d, f: block_params(d, f) - 4 * d,),
        "ffn_biases": lambda: (lambda d, f: block_params(d, f) - f - d,),
        "biases_and_norms": lambda: (lambda d, f: 4 * d * d + 2 * d * f,),
        "two_attention_matrices": lambda: (lambda d, f: block_params(d, f) - 2 * d * d,),
        "one_norm": lambda: (lambda d, f: block_params(d, f) - 2 * d,),
        "no_biases": lambda: (lambda d, f: 4 * d * d + 2 * d * f + 4 * d,),
        "no_output_projection": lambda: (
            lambda d, f: block_params(d, f) - d * d - d,),
    },
    "check_pre_norm": {
        "post_norm": lambda: (lambda b, x: pre_norm(b, x, "post"),),
        "normalised_stream": lambda: (lambda b, x: pre_norm(b, x, "stream"),),
        "no_first_residual": lambda: (lambda b, x: pre_norm(b, x, "no_first"),),
        "no_second_residual": lambda: (lambda b, x: pre_norm(b, x, "no_second"),),
        "one_norm": lambda: (lambda b, x: pre_norm(b, x, "one_norm"),),
        "raw_key_value": lambda: (lambda b, x: pre_norm(b, x, "raw_kv"),),
        "no_activation": lambda: (lambda b, x: pre_norm(b, x, "no_activation"),),
        "pair": lambda: (lambda b, x: pre_norm(b, x, "pair"),),
        "whole_block": lambda: (lambda b, x: b(x)[0],),
    },
    "check_weights_mib": {
        "megabytes": lambda: (lambda b, length, h, t: b * h * length ** 2
                              * (torch.finfo(t).bits // 8) / 1e6,),
        "bytes": lambda: (lambda b, length, h, t: b * h * length ** 2
                          * (torch.finfo(t).bits // 8),),
        "bits": lambda: (lambda b, length, h, t: b * h * length ** 2
                         * torch.finfo(t).bits / 2 ** 20,),
        "dtype_ignored": lambda: (lambda b, length, h, t: b * h * length ** 2 * 4 / 2 ** 20,),
        "gibibytes": lambda: (lambda b, length, h, t: b * h * length ** 2
                              * (torch.finfo(t).bits // 8) / 2 ** 30,),
    },
    "check_tiled_softmax": {
        "whole_row": lambda: (lambda s, b: torch.softmax(s, dim=-1),),
        "per_block": lambda: (lambda s, b: torch.cat(
            [x.softmax(-1) for x in s.split(b, dim=-1)], dim=-1),),
        "per_block_averaged": lambda: (lambda s, b: torch.cat(
            [x.softmax(-1) for x in s.split(b, dim=-1)], dim=-1)
            / len(s.split(b, dim=-1)),),
        "no_rescale": lambda: (lambda s, b: tiled_softmax(s, b, rescale=False),),
        "one_pass": lambda: (lambda s, b: tiled_softmax(s, b, second_pass=False),),
        "no_max": lambda: (lambda s, b: tiled_softmax(s, b, use_max=False),),
    },
    "check_masked_tiles": {
        "nan": lambda: (lambda *a: masked_tiles(*a, safe=False),),
        "final_division": lambda: (lambda *a: masked_tiles(*a, final_where=False),),
        "empty_row_uniform": lambda: (lambda *a: masked_tiles(*a, fill=-1e9),),
        "inverted": lambda: (lambda *a: masked_tiles(*a, invert=True),),
        "unscaled": lambda: (lambda *a: masked_tiles(*a, scale=1.0),),
        "whole_row": lambda: (lambda q, k, v, mask, b: masked_softmax(
            q @ k.mT / 2, mask) @ v,),
    },
    "check_cache_bytes": {
        "keys_only": lambda: (lambda n, h, d, length, b, s: n * h * d * length * b * s,),
        "no_bytes": lambda: (lambda n, h, d, length, b, s: 2 * n * h * d * length * b,),
        "bits": lambda: (lambda n, h, d, length, b, s: 16 * n * h * d * length * b * s,),
        "one_layer": lambda: (lambda n, h, d, length, b, s: 2 * h * d * length * b * s,),
        "one_sequence": lambda: (lambda n, h, d, length, b, s: 2 * n * h * d * length * s,),
    },
    "check_expand_kv": {
        "tiled": lambda: (lambda x, h: x.repeat(1, h // x.size(1), 1, 1),),
        "copies_after_length": lambda: (lambda x, h: expand_kv(x, h, "after_length"),),
        "view_not_contiguous": lambda: (lambda x, h: expand_kv(x, h, "view"),),
        "group_size": lambda: (lambda x, h: x,),
        "expand_alone": lambda: (lambda x, h: x.expand(x.size(0), h, *x.shape[2:]),),
    },
    "check_chunk_mask": {
        "top_left": lambda: (lambda q, p: torch.arange(p + q)[None] <= torch.arange(q)[:, None],),
        "no_cache": lambda: (lambda q, p: torch.arange(q)[None] <= torch.arange(q)[:, None],),
        "no_diagonal": lambda: (lambda q, p: torch.arange(p + q)[None]
                                < p + torch.arange(q)[:, None],),
        "inverted": lambda: (lambda q, p: ~chunk_mask(q, p),),
        "library": lambda: (lambda q, p: causal_mask(q, p + q),),
    },
    "check_copy_batch": {
        "reversed": lambda: (lambda n, g: copy_batch(n, g, "reversed"),),
        "no_separator": lambda: (lambda n, g: copy_batch(n, g, "no_sep"),),
        "separator_as_digit": lambda: (lambda n, g: copy_batch(n, g, "eleven"),),
        "fresh_answer": lambda: (lambda n, g: copy_batch(n, g, "fresh"),),
        "not_random": lambda: (lambda n, g: copy_batch(n, g, "zeros"),),
        "generator_ignored": lambda: (lambda n, g: copy_batch(n, g, "global"),),
    },
    "check_answer_loss": {
        "all_positions": lambda: (lambda lg, s: F.cross_entropy(lg.flatten(0, 1),
                                                                 s[:, 1:].flatten()),),
        "off_by_one": lambda: (lambda lg, s: answer_loss(lg, s, N, N),),
        "with_separator": lambda: (lambda lg, s: answer_loss(lg, s, N - 1, N),),
        "summed": lambda: (lambda lg, s: answer_loss(lg, s, reduction="sum"),),
        "not_a_tensor": lambda: (lambda lg, s: answer_loss(lg, s).item(),),
        "nll_on_logits": lambda: (lambda lg, s: F.nll_loss(lg[:, N:].flatten(0, 1),
                                                           s[:, N + 1:].flatten()),),
    },
    "check_remove_head": {
        "rows": lambda: (lambda m, h: remove_head(m, h, "rows"),),
        "not_in_place": lambda: (lambda m, h: remove_head(m, h, "copy"),),
        "first_block": lambda: (lambda m, h: remove_head(m, h, "first"),),
        "query_rows": lambda: (lambda m, h: remove_head(m, h, "query"),),
        "no_grad": lambda: (lambda m, h: remove_head(m, h, "no_grad"),),
        "value_bias": lambda: (lambda m, h: remove_head(m, h, "values"),),
    },
    "check_find_induction_head": {
        "previous_token": lambda: (lambda w, k: best(w.diagonal(-1, -2, -1).mean(dim=(1, 3))),),
        "twin": lambda: (lambda w, k: best(head_score(w, k, 0)),),
        "swapped": lambda: (lambda w, k: best(head_score(w, k))[::-1],),
        "random_head": lambda: (lambda w, k: (0, 0),),
    },
    "check_rotate_half": {
        "signs_swapped": lambda: (lambda x: -rotate_half(x),),
        "no_minus": lambda: (lambda x: torch.cat(x.chunk(2, -1)[::-1], -1),),
        "interleaved": lambda: (lambda x: torch.stack(
            [-x[..., 1::2], x[..., 0::2]], -1).flatten(-2),),
        "reversed": lambda: (lambda x: x.flip(-1),),
        "in_place": lambda: (swap_halves_in_place,),
    },
    "check_rotary_complex": {
        "halves": lambda: (lambda x, p: apply_rotary(x, p),),
        "complex_result": lambda: (lambda x, p: rope_complex(x, p, how="complex"),),
        "positions_ignored": lambda: (lambda x, p: rope_complex(x, p, how="ignored"),),
        "backwards": lambda: (lambda x, p: rope_complex(x, p, how="conj"),),
        "exponent_i": lambda: (lambda x, p: rope_complex(x, p, how="exponent_i"),),
        "not_complex": lambda: (lambda x, p: apply_rotary(x, p, interleaved=True),),
    },
    "check_unturned_pairs": {
        "turned": lambda: (lambda d, b, n: d // 2 - unturned(d, b, n),),
        "no_two_pi": lambda: (lambda d, b, n: unturned(d, b, n, turn=1.0),),
        "all_features": lambda: (lambda d, b, n: unturned(d, b, n, pairs=d),),
        "exponent_i": lambda: (lambda d, b, n: unturned(d, b, n, two=1),),
    },
    "check_alibi_slopes": {
        "naive": lambda: (slopes_power_of_two,),
        "ascending": lambda: (lambda n: slopes(n)[::-1],),
        "sorted": lambda: (lambda n: sorted(slopes(n), reverse=True),),
        "odd_extra": lambda: (lambda n: slopes(n, extra=slice(1, None, 2)),),
        "negative": lambda: (lambda n: [-s for s in slopes(n)],),
        "from_zero": lambda: (lambda n: [2 ** (-8 * h / n) for h in range(n)],),
        "half": lambda: (lambda n: torch.tensor(slopes(n), dtype=torch.float16),),
        "half/bfloat16": lambda: (lambda n: torch.tensor(slopes(n), dtype=torch.bfloat16),),
    },
    "check_absorbed_query": {
        "not_per_head": lambda: (lambda q, w, h: q @ w,),
        "head_minor": lambda: (lambda q, w, h: q @ w.unflatten(0, (-1, h)).transpose(0, 1),),
        "transposed": lambda: (lambda q, w, h: q @ w.unflatten(0, (h, -1)).mT,),
        "scaled": lambda: (lambda q, w, h: q @ w.unflatten(0, (h, -1)) / q.size(-1) ** 0.5,),
    },
    "check_latent_cache_bytes": {
        "per_head": lambda: (lambda c, r, length, b, s: 2 * 16 * length * b * s,),
        "factor_two": lambda: (lambda c, r, length, b, s: 2 * (c + r) * length * b * s,),
        "no_rope": lambda: (lambda c, r, length, b, s: c * length * b * s,),
        "rope_twice": lambda: (lambda c, r, length, b, s: (c + 2 * r) * length * b * s,),
        "bits": lambda: (lambda c, r, length, b, s: 8 * (c + r) * length * b * s,),
    },
    "check_key_projection": {
        "transposed": lambda: (lambda m: (m.k_up.weight @ m.kv_down.weight).T,),
        "wrong_order": lambda: (lambda m: m.kv_down.weight @ m.k_up.weight,),
        "values": lambda: (lambda m: m.v_up.weight @ m.kv_down.weight,),
    },
}


def _check(checker: str, args: tuple):
    torch.manual_seed(0)
    with warnings.catch_warnings():  # k.T on a batch warns: a planted mistake
        warnings.simplefilter("ignore", UserWarning)
        return getattr(exercises, checker)(*args)


def test_every_checker_has_a_catalogue_and_every_mistake_a_planted_answer():
    checkers = {n for n in exercises.__all__ if n.startswith("check_")}
    assert set(CATALOGUE) == checkers
    assert {c: {n.split("/")[0] for n in m} for c, m in WRONG.items()} == {
        c: set(m) for c, m in CATALOGUE.items()}
    # at least three classic mistakes per exercise
    assert all(len(m) >= 3 for m in CATALOGUE.values())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The two catalogue tests run over every planted mistake and right answer in
    WRONG and RIGHT, read when the whole module has run: the later sections of this
    file add to both."""
    if metafunc.function is test_the_planted_mistake_is_refused_with_its_hint:
        planted = [(c, n) for c, mistakes in WRONG.items() for n in mistakes]
        metafunc.parametrize("checker, name", planted,
                             ids=[f"{c}-{n}" for c, n in planted])
    elif metafunc.function is test_a_right_answer_is_accepted:
        answers = [(c, i) for c, found in RIGHT.items() for i in range(len(found))]
        metafunc.parametrize("checker, i", answers,
                             ids=[f"{c}-{i}" for c, i in answers])


def test_the_planted_mistake_is_refused_with_its_hint(checker, name):
    verdict = _check(checker, WRONG[checker][name]())
    mistake = CATALOGUE[checker][name.split("/")[0]]
    assert not verdict, f"{checker} accepted the mistake {name!r}"
    assert mistake.message in verdict.message, verdict.message
    assert "Traceback" not in verdict.message


def test_a_right_answer_is_accepted(checker, i):
    verdict = _check(checker, RIGHT[checker][i]())
    assert verdict, repr(verdict)
    assert repr(verdict).startswith("Correct: ")


def test_every_exercise_accepts_two_styles():
    assert set(RIGHT) == set(CATALOGUE)
    assert all(len(answers) >= 2 for answers in RIGHT.values())


def _headings(chapter: int) -> set[str]:
    (path,) = BOOK.glob(f"{chapter:02d}_*.ipynb")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return {line.lstrip("#").strip()
            for cell in cells if cell["cell_type"] == "markdown"
            for line in "".join(cell["source"]).splitlines()
            if re.match(r"#{1,6} ", line)}


MISTAKES = [m for mistakes in CATALOGUE.values() for m in mistakes.values()]


@pytest.mark.parametrize("mistake", MISTAKES,
                         ids=[f"{m.checker}-{m.name}" for m in MISTAKES])
def test_the_section_a_hint_names_is_a_heading_of_its_chapter(mistake):
    headings = _headings(mistake.chapter)
    assert mistake.section in headings, (
        f"{mistake.checker}/{mistake.name} points at {mistake.section!r}, "
        f"not a heading of chapter {mistake.chapter}")
    assert not mistake.section.startswith(("Exercise", "Solution", "Summary"))
    assert f"'{plain(mistake.section)}' in chapter {mistake.chapter}" in mistake.message


def test_a_renamed_heading_fails_the_heading_test():
    mistake = CATALOGUE["check_attention"]["unscaled"]
    renamed = type(mistake)(mistake.checker, mistake.name, mistake.hint,
                            mistake.chapter, "Why we scale")
    with pytest.raises(AssertionError):
        test_the_section_a_hint_names_is_a_heading_of_its_chapter(renamed)


def test_merge_without_permute_or_transpose_is_not_said_to_use_transpose():
    unbound = _check("check_merge_heads",
                     (lambda x: torch.cat(x.unbind(1), dim=-1),))
    assert unbound and "without permute" in unbound.message
    assert "transpose" not in unbound.message
    chapter = _check("check_merge_heads", (merge_heads,))
    assert chapter and "transpose(1, 2)" in chapter.message


# --- chapter 3: more planted mistakes ---

def _few_positions_shift():  # fitted on 6 positions only: not unique
    # in float64: a float32 fit of these ill-conditioned columns was exact on
    # its 6 positions or not depending on the thread count (1 run in 9 failed)
    pe = sinusoidal_encoding(9, 8).double()
    return torch.linalg.lstsq(pe[:-3], pe[3:]).solution.float()


ROUND4_SHIFT = {
    "not_inverted": lambda: (shift(two=-2),),
    "integer_division": lambda: (shift(two=0),),
    "other_width": lambda: (shift(two=2 * 8 / 64),),
    "fitted_few": lambda: (_few_positions_shift(),),
}
WRONG["check_shift_matrix"].update(ROUND4_SHIFT)


# --- chapter 5: more planted mistakes ---

ROUND4_HEADS = {
    ("check_split_heads", "hard_coded"):
        lambda: (lambda x, num_heads: x.view(3, 6, 4, 2).transpose(1, 2),),
    ("check_merge_heads", "hard_coded"):
        lambda: (lambda x: x.transpose(1, 2).reshape(3, 6, 8),),
    ("check_head_columns", "hard_coded"):
        lambda: (lambda x, h, num_heads: x[..., 2 * h:2 * h + 2],),
}
for (_checker, _name), _plant in ROUND4_HEADS.items():
    WRONG[_checker][_name] = _plant


@pytest.mark.parametrize("checker, name", sorted(ROUND4_HEADS))
def test_hard_coded_shapes_get_a_hint(checker, name):
    test_the_planted_mistake_is_refused_with_its_hint(checker, name)
    if checker != "check_head_columns":  # the hint names the shape written
        verdict = _check(checker, WRONG[checker][name]())
        assert "(3, 6, 4, 2)" in verdict.message or "(3, 6, 8)" in verdict.message


# --- chapter 10: more planted mistakes ---

def split_qkv(qkv, num_heads, pattern="three h d", out="three b h l d"):
    return rearrange(qkv, f"b l ({pattern}) -> {out}", three=3, h=num_heads)


def split_qkv_by_hand(qkv, num_heads):  # reshape + permute: no rearrange
    batch, length, _ = qkv.shape
    return qkv.reshape(batch, length, 3, num_heads, -1).permute(2, 0, 3, 1, 4)


ROUND4_RIGHT = {
    "check_split_qkv": [
        lambda: (split_qkv,),
        lambda: (lambda t, h: rearrange(t, "b l (s h d) -> s b h l d", s=3, h=h),),
        lambda: (lambda t, h: tuple(rearrange(t, "b l (three h d) -> three b h l d",
                                              three=3, h=h)),),
    ],
}
ROUND4_WRONG = {
    "check_split_qkv": {
        "inner_heads": lambda: (lambda t, h: split_qkv(t, h, "three d h"),),
        "per_head": lambda: (lambda t, h: split_qkv(t, h, "h three d"),),
        "role_inner": lambda: (lambda t, h: split_qkv(t, h, "h d three"),),
        "head_first": lambda: (lambda t, h: split_qkv(t, h, out="three h b l d"),),
        "not_moved": lambda: (lambda t, h: split_qkv(t, h, out="three b l h d"),),
        "plain_reshape": lambda: (lambda t, h: t.reshape(3, t.size(0), h, t.size(1),
                                                         -1),),
        "no_rearrange": lambda: (split_qkv_by_hand,),
    },
}


# --- chapter 11: more planted mistakes ---

def sdpa_unscaled(m, x, mask=None):  # scale=1.0: no 1 / sqrt(D) at all
    q, k, v = (split_heads(p(x), m.num_heads) for p in (m.q_proj, m.k_proj, m.v_proj))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return m.out_proj(merge_heads(heads))


ROUND4_WRONG["check_sdpa_attention"] = {"unscaled": lambda: (sdpa_unscaled,)}

# --- registration (the catalogue tests read RIGHT and WRONG) ---

for _checker, _answers in ROUND4_RIGHT.items():
    RIGHT.setdefault(_checker, []).extend(_answers)
for _checker, _mistakes in ROUND4_WRONG.items():
    WRONG.setdefault(_checker, {}).update(_mistakes)


# --- chapter 13: more planted mistakes ---
# --- chapter 1: more planted mistakes ---
# `.split()` swallows runs of spaces; a stale third BPE merge ("b", "ug").
ROUND4_CHAPTER1 = {
    "check_tokenizer": {
        "whitespace_split": lambda: (lambda t: [
            w.lower() for w in re.sub(r"[!.?,]", "", t).split()],),
    },
    "check_bpe_merges": {
        "stale_pair": lambda: ([("u", "g"), ("ug", "</w>"), ("b", "ug")],),
        "stale_pair/repeated": lambda: ([("u", "g"), ("u", "g"), ("b", "ug</w>")],),
    },
}
for _checker, _planted in ROUND4_CHAPTER1.items():
    WRONG[_checker].update(_planted)


def test_stale_merge_names_the_pair_and_the_merge_before():
    verdict = _check("check_bpe_merges", ROUND4_CHAPTER1["check_bpe_merges"]["stale_pair"]())
    assert "merges[2] = ('b', 'ug')" in verdict.message
    assert "bug is b ug</w>" in verdict.message


# --- chapter 2: more planted mistakes ---
# a flattened output (Exercises 2.1 and 2.2); a vocabulary rounded to 50,000.
ROUND4_CHAPTER2 = {
    "check_onehot_embedding": {
        "flattened": lambda: (lambda ids, w: F.one_hot(
            ids.flatten(), w.size(0)).float() @ w,),
        "flattened/result": lambda: (lambda ids, w: (F.one_hot(
            ids, w.size(0)).float() @ w).reshape(-1, w.size(1)),),
    },
    "check_padding_embedding": {
        "flattened": lambda: (lambda e: (e, e(encode(
            [*SENTENCES, "What is next?"], STOI, pad_id=0)[0]).view(-1, 8)))(
            nn.Embedding(len(STOI), 8, padding_idx=0)),
    },
    "check_embedding_parameters": {
        "rounded_vocab": lambda: (50_000 * 768,),
    },
}
for _checker, _planted in ROUND4_CHAPTER2.items():
    WRONG[_checker].update(_planted)


# --- chapter 8: more planted mistakes ---
_CONCAT_RIGHT = {
    "cat/-1": lambda hs: torch.cat(hs, dim=-1),
    "stack/-2/flatten": lambda hs: torch.stack(hs, dim=-2).flatten(-2),
    "stack/2/reshape": lambda hs: torch.stack(hs, dim=2).reshape(
        hs[0].shape[0], hs[0].shape[1], -1),
    "stack/1/merge_heads": lambda hs: merge_heads(torch.stack(hs, dim=1)),
    "dstack": lambda hs: torch.dstack(hs),
    "contiguous_view": lambda hs: torch.stack(hs, dim=1).transpose(
        1, 2).contiguous().view(hs[0].shape[0], hs[0].shape[1], -1),
}


@pytest.mark.parametrize("form", sorted(_CONCAT_RIGHT))
def test_concat_heads_accepts_every_correct_concatenation(form):
    verdict = _check("check_concat_heads", (_CONCAT_RIGHT[form],))
    assert verdict, verdict.message


@pytest.mark.parametrize("form, name", [
    (lambda hs: torch.stack(hs, dim=-1).flatten(-2), "interleaved"),
    (lambda hs: torch.stack(hs[::-1], dim=-2).flatten(-2), "reversed"),
    (lambda hs: torch.cat(hs[::-1], dim=-1), "reversed"),
    (lambda hs: torch.stack(hs, dim=1).reshape(
        hs[0].shape[0], hs[0].shape[1], -1), "no_transpose"),
    (lambda hs: torch.cat(hs, dim=1), "wrong_axis"),
])
def test_concat_heads_still_refuses_wrong_orders(form, name):
    verdict = _check("check_concat_heads", (form,))
    assert not verdict
    assert CATALOGUE["check_concat_heads"][name].hint in verdict.message

# --- chapter 18: more planted mistakes ---

WRONG["check_absorbed_query"]["head_zero"] = lambda: (
    lambda q, w, h: q @ w[:q.size(-1)],)


def test_head_zero_block_for_every_head_is_named():
    verdict = _check("check_absorbed_query",
                     WRONG["check_absorbed_query"]["head_zero"]())
    assert not verdict
    assert CATALOGUE["check_absorbed_query"]["head_zero"].message \
        in verdict.message
    assert "w_uk[:D]" in verdict.message

# --- chapter 1: more planted mistakes ---
# a misspelt end-of-word marker; the two sentences of Exercise 1.2 swapped.
ROUND5_CHAPTER1 = {
    "check_bpe_merges": {
        "misspelt_marker": lambda: ([("u", "g"), ("ug", "w"), ("b", "ugw")],),
        "misspelt_marker/angle": lambda: (
            [("u", "g"), ("ug", "<w>"), ("b", "ug<w>")],),
    },
    "check_padded_batch": {
        "swapped": lambda: encode(["A basic split!", "What will come next?"],
                                  build_vocab(SENTENCES, specials=("<pad>",)),
                                  pad_id=0),
    },
}
for _checker, _planted in ROUND5_CHAPTER1.items():
    WRONG[_checker].update(_planted)


def test_dropped_marker_is_still_a_stale_pair():
    verdict = _check("check_bpe_merges",
                     ([("u", "g"), ("ug", "</w>"), ("b", "ug")],))
    assert CATALOGUE["check_bpe_merges"]["stale_pair"].hint in verdict.message

# --- chapter 2: more planted mistakes ---
# the two sizes added; the context length taken for d_model.
WRONG["check_embedding_parameters"].update({
    "added": lambda: (50257 + 768,),
    "context_rows": lambda: (50257 * 1024,),
})


# --- chapter 3: more planted mistakes ---

def _ahead_fitted():  # least squares on 64 positions: M of one step
    pe = sinusoidal_encoding(64, 8)
    return torch.linalg.lstsq(pe[:-1], pe[1:]).solution


RIGHT["check_ahead_matrix"] = [lambda: (shift(k=1),),
                               lambda: (_ahead_fitted(),),
                               lambda: (2.5 * shift(k=1).double(),)]
WRONG["check_ahead_matrix"] = {
    "dot_product": lambda: (torch.eye(8),),
    "behind": lambda: (shift(k=1).T,),
    "other_offset": lambda: (shift(k=3),),
}


# --- chapter 5: more planted mistakes ---

def _split_transpose_first(x, num_heads):  # transposes, then cuts
    batch, length, d_model = x.shape
    return x.transpose(1, 2).reshape(batch, num_heads, length,
                                     d_model // num_heads)


WRONG["check_split_heads"]["transpose_first"] = lambda: (_split_transpose_first,)


def test_merge_transpose_view_hint_names_transpose():
    def merge(x):
        batch, heads, length, head_dim = x.shape
        return x.transpose(1, 2).view(batch, length, heads * head_dim)

    verdict = _check("check_merge_heads", (merge,))
    assert not verdict
    assert "(or transpose)" in verdict.message

# --- chapter 12: more planted mistakes ---

WRONG["check_pre_norm"].update({
    "pair_sum": lambda: (
        lambda b, x: x + b.attn(b.norm1(x), need_weights=False),),
    "fixed_relu": lambda: (lambda b, x: (lambda h: h + b.linear2(F.relu(
        b.linear1(b.norm2(h)))))(x + b.attn(b.norm1(x))[0]),),
    "final_norm": lambda: (
        lambda b, x: F.layer_norm(pre_norm(b, x), (x.size(-1),)),),
    "final_norm/norm2": lambda: (lambda b, x: b.norm2(pre_norm(b, x)),),
})


@pytest.mark.parametrize("name", ["pair_sum", "fixed_relu", "final_norm",
                                  "final_norm/norm2"])
def test_pre_norm_mistakes_are_named(name):
    verdict = _check("check_pre_norm", WRONG["check_pre_norm"][name]())
    assert not verdict
    mistake = CATALOGUE["check_pre_norm"][name.split("/")[0]]
    assert mistake.message in verdict.message, verdict.message
    assert "Traceback" not in verdict.message

# --- chapter 7: more planted mistakes ---

# hiding the pad queries as well as the pad keys: named as pad_queries
WRONG["check_decoder_mask"]["pad_queries/both"] = lambda: (
    lambda n: padding_mask(n) & padding_mask(n).transpose(-1, -2)
    & causal_mask(int(n.max())),)
WRONG["check_safe_softmax"]["no_renormalise"] = lambda: (
    lambda s, m: torch.softmax(s, dim=-1) * m,)


@pytest.mark.parametrize("checker, name", [
    ("check_decoder_mask", "pad_queries/both"),
    ("check_safe_softmax", "no_renormalise"),
])
def test_chapter7_mistakes_are_named(checker, name):
    verdict = _check(checker, WRONG[checker][name]())
    assert not verdict
    assert CATALOGUE[checker][name.split("/")[0]].hint in verdict.message

# --- chapter 8: more planted mistakes ---

WRONG["check_num_parameters"]["one_bias"] = lambda: (
    lambda d, h, bias=True: 4 * d * d + (4 if bias else 0),)


def test_one_bias_per_layer_is_named():
    verdict = _check("check_num_parameters",
                     WRONG["check_num_parameters"]["one_bias"]())
    assert not verdict
    assert CATALOGUE["check_num_parameters"]["one_bias"].hint \
        in verdict.message

# --- chapter 17: more planted mistakes ---

def softcap(cap, how="right"):
    def score_mod(score, b, h, q_idx, kv_idx):
        return {"right": lambda: cap * torch.tanh(score / cap),
                "uncapped": lambda: score,
                "no_divide": lambda: cap * torch.tanh(score),
                "no_multiply": lambda: torch.tanh(score / cap),
                "clamp": lambda: score.clamp(-cap, cap),
                "scaled_again": lambda: cap * torch.tanh(
                    score / math.sqrt(8) / cap)}[how]()
    return score_mod


ROUND5_SOFTCAP = {name: (lambda name=name: (
    lambda cap: softcap(cap, name),)) for name in (
        "uncapped", "no_divide", "no_multiply", "clamp", "scaled_again")}
WRONG["check_softcap_score_mod"] = dict(ROUND5_SOFTCAP)
RIGHT["check_softcap_score_mod"] = [
    lambda: (softcap,),
    lambda: (lambda cap: lambda s, b, h, q, kv: torch.tanh(s / cap) * cap,)]


def test_softcap_needs_a_function():
    verdict = _check("check_softcap_score_mod", (lambda cap: cap,))
    assert not verdict and "should return a function" in verdict.message


# --- chapter 13: more planted mistakes ---

WRONG["check_weights_mib"]["one_head"] = lambda: (
    lambda b, length, h, dtype: b * length * length
    * (torch.finfo(dtype).bits // 8) / 2**20,)


# --- chapter 14: more planted mistakes ---

WRONG["check_cache_bytes"]["no_kv_heads"] = lambda: (
    lambda n, h, d, length, b, s: 2 * n * d * length * b * s,)
WRONG["check_cache_bytes"]["gib"] = lambda: (
    lambda n, h, d, length, b, s: 2 * n * h * d * length * b * s / 2**30,)


@pytest.mark.parametrize("name", ["no_kv_heads", "gib"])
def test_cache_bytes_names_the_heads_and_the_unit(name):
    verdict = _check("check_cache_bytes", WRONG["check_cache_bytes"][name]())
    assert not verdict
    assert CATALOGUE["check_cache_bytes"][name].message in verdict.message


def test_cache_bytes_in_gb_is_named_as_a_unit():
    verdict = _check("check_cache_bytes", (
        lambda n, h, d, length, b, s: 2 * n * h * d * length * b * s / 1e9,))
    assert not verdict
    assert CATALOGUE["check_cache_bytes"]["gib"].message in verdict.message

# --- chapter 18: more planted mistakes ---

WRONG["check_absorbed_query"]["unchanged"] = lambda: (lambda q, w, h: q,)


def test_query_returned_unchanged_is_named():
    verdict = _check("check_absorbed_query",
                     WRONG["check_absorbed_query"]["unchanged"]())
    assert not verdict
    assert CATALOGUE["check_absorbed_query"]["unchanged"].message \
        in verdict.message

# --- chapter 10: more planted mistakes ---
# an int mask gets the exercise's convention (True = blocked) in its hint;
# chapter 8's count without a LayerNorm; fc counted from n_head * d_k.

WRONG["check_einsum_num_parameters"]["chapter8_sizes/no_norm"] = lambda: (
    lambda h, d, dk, dv: 4 * (d * d + d),)
WRONG["check_einsum_num_parameters"]["fc_from_d_k"] = lambda: (
    lambda h, d, dk, dv: (2 * (d * h * dk + h * dk) + d * h * dv + h * dv
                          + h * dk * d + d + 2 * d),)


def test_int_einops_mask_hint_says_true_is_blocked():
    def as_int(valid_lens, length):
        pad = padding_mask(valid_lens, length)[:, 0]
        return (~(pad & causal_mask(length))).int()

    verdict = _check("check_einops_mask", (as_int,))
    assert not verdict
    assert "True = blocked" in verdict.message
    assert "True = may attend" not in verdict.message


# --- chapter 11: more planted mistakes ---
# the causal attn_mask transposed; the heads never split.

def _torch_masks_transposed(valid_lens, length):
    return (~padding_mask(valid_lens, length)[:, 0, 0],
            ~causal_mask(length).T)


def _sdpa_one_head(m, x, mask=None):
    q, k, v = (p(x) for p in (m.q_proj, m.k_proj, m.v_proj))
    return m.out_proj(F.scaled_dot_product_attention(q, k, v,
                                                     attn_mask=mask))


WRONG["check_torch_masks"]["causal_transposed"] = lambda: (
    _torch_masks_transposed,)
WRONG["check_sdpa_attention"]["one_head"] = lambda: (_sdpa_one_head,)


def _to_torch_always_bias(m):  # bias=True even for a bias-free m
    t = nn.MultiheadAttention(m.d_model, m.num_heads, batch_first=True)
    with torch.no_grad():
        t.in_proj_weight.copy_(torch.cat(
            [m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        t.out_proj.weight.copy_(m.out_proj.weight)
        if m.q_proj.bias is not None:
            t.in_proj_bias.copy_(torch.cat(
                [m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
            t.out_proj.bias.copy_(m.out_proj.bias)
    return t


WRONG["check_to_torch"]["made_with_bias"] = lambda: (_to_torch_always_bias,)


# --- chapter 9: more planted mistakes ---
# lengths returned as floats (repeat_interleave keeps the integer dtype).

WRONG["check_repeat_lens"]["float_lengths"] = lambda: (
    lambda v, h: v.unsqueeze(1).expand(-1, h, *v.shape[1:])
    .reshape(-1, *v.shape[1:]).float(),)


# --- chapter 10: more planted mistakes ---
# k read as already transposed, 'bhld,bhdt->bhlt'.

WRONG["check_einsum_scores"]["k_transposed"] = lambda: (
    lambda q, k: torch.einsum("bhld,bhdt->bhlt", q, k)
    / math.sqrt(q.size(-1)),)


def test_k_transposed_einsum_is_not_called_a_key_letter():
    test_the_planted_mistake_is_refused_with_its_hint(
        "check_einsum_scores", "k_transposed")
    verdict = _check("check_einsum_scores", WRONG["check_einsum_scores"][
        "k_transposed"]())
    assert CATALOGUE["check_einsum_scores"]["key_letter"].message \
        not in verdict.message


# --- chapter 11: more planted mistakes ---
# the weights concatenated along dim 1 and reshaped; rows from nowhere;
# additive float masks accepted without the word "True = blocked" alone.

def _to_torch_rows(rows):
    def fn(m):
        t = nn.MultiheadAttention(m.d_model, m.num_heads,
                                  bias=m.q_proj.bias is not None,
                                  batch_first=True)
        with torch.no_grad():
            t.in_proj_weight.copy_(rows(m))
        return t
    return fn


WRONG["check_to_torch"]["cat_dim1"] = lambda: (_to_torch_rows(
    lambda m: torch.cat([m.q_proj.weight, m.k_proj.weight,
                         m.v_proj.weight], dim=1).reshape(
        3 * m.d_model, m.d_model)),)
WRONG["check_to_torch"]["unknown_rows"] = lambda: (_to_torch_rows(
    lambda m: torch.ones(3 * m.d_model, m.d_model)),)


def test_additive_float_masks_are_accepted_as_float_masks():
    def additive(valid_lens, length):
        valid = padding_mask(valid_lens, length)[:, 0, 0]
        return tuple(torch.zeros(b.shape).masked_fill(b, float("-inf"))
                     for b in (~valid, ~causal_mask(length)))

    verdict = _check("check_torch_masks", (additive,))
    assert verdict
    assert "additive float masks" in verdict.message

# --- chapter 1: more planted mistakes ---
# sorted words numbered from 2 (a gap after "<pad>"); a hand-written
# batch left ragged; a hand-written list answer is accepted.
WRONG["check_vocab"]["offset"] = lambda: ({"<pad>": 0, **{
    w: i + 2 for i, w in enumerate(sorted(build_vocab(SENTENCES)))}},)
WRONG["check_padded_batch"]["ragged"] = lambda: (
    [[12, 13, 3, 8], [1, 2, 10]], [4, 3])


def test_offset_vocab_is_not_called_unsorted():
    verdict = _check("check_vocab", WRONG["check_vocab"]["offset"]())
    assert CATALOGUE["check_vocab"]["unsorted"].message \
        not in verdict.message


def test_hand_written_lists_are_accepted():
    assert _check("check_padded_batch",
                  ([[12, 13, 3, 8], [1, 2, 10, 0]], [4, 3]))
    verdict = _check("check_padded_batch",
                     ([[12, 13, 3, 8], [1, 2, 10, 0]], [4, 4]))
    assert CATALOGUE["check_padded_batch"]["padded_lengths"].message \
        in verdict.message

# --- chapter 14: more planted mistakes ---
# a top-left tril is named as the alignment mistake, not refused for style;
# a correct tril(past) is accepted.

@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_top_left_tril_is_named_as_the_alignment_mistake(dtype):
    verdict = _check("check_chunk_mask", (
        lambda q, p: torch.ones(q, p + q, dtype=dtype).tril(),))
    assert not verdict
    assert CATALOGUE["check_chunk_mask"]["top_left"].message \
        in verdict.message


def test_correct_tril_is_accepted():
    verdict = _check("check_chunk_mask", (
        lambda q, p: torch.ones(q, p + q, dtype=torch.bool).tril(p),))
    assert verdict
    assert "tril(past)" in verdict.message

# --- chapter 17: more planted mistakes ---

WRONG["check_softcap_score_mod"]["math_tanh"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: cap * math.tanh(s / cap),)
WRONG["check_alibi_slopes"]["halves"] = lambda: (
    lambda n: [2.0 ** -(h + 1) for h in range(n)],)


def test_math_tanh_gets_no_compiler_error():
    verdict = _check("check_softcap_score_mod",
                     WRONG["check_softcap_score_mod"]["math_tanh"]())
    assert "data-dependent" not in verdict.message
    assert "raised" not in verdict.message

# --- chapter 4: more planted mistakes ---
# Exercise 4.4: a previous-token head on the positions alone.

def _one_step_back():  # M with PE[p + 1]^T = M PE[p]^T, d_model = 8
    i = torch.arange(4, dtype=torch.float64)
    angle = 10000.0 ** (-2 * i / 8)  # (4,): omega_i, one step
    c, s = angle.cos(), angle.sin()
    return torch.block_diag(*[torch.tensor([[c[j], s[j]], [-s[j], c[j]]])
                              for j in range(4)]).float()


def _layer(weight, bias=False):
    layer = nn.Linear(8, 8, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def _previous_shared():
    q = _layer(10 * _one_step_back().T)
    return q, q


RIGHT["check_previous_token"] = [
    lambda: (_layer(10 * _one_step_back().T), _layer(torch.eye(8))),
    lambda: (_layer(torch.eye(8), bias=True),  # keys one step on
             _layer(10 * _one_step_back())),
    lambda: (lambda p: p @ (10 * _one_step_back()), lambda p: p),
]
WRONG["check_previous_token"] = {
    "shared": _previous_shared,
    "next_token": lambda: (_layer(10 * _one_step_back()),
                           _layer(torch.eye(8))),
    "itself": lambda: (_layer(10 * torch.eye(8)), _layer(torch.eye(8))),
    "too_flat": lambda: (_layer(_one_step_back().T), _layer(torch.eye(8))),
}


def test_random_layers_are_not_a_previous_token_head():
    torch.manual_seed(0)
    verdict = exercises.check_previous_token(nn.Linear(8, 8),
                                             nn.Linear(8, 8))
    assert not verdict
    assert "Traceback" not in verdict.message


# --- chapter 3: more planted mistakes ---
# a right table returned in half precision gets a dtype hint, not a ratio.

WRONG["check_sinusoidal"]["half"] = lambda: (
    lambda length, d_model: sinusoidal_power(length, d_model).half(),)
WRONG["check_sinusoidal"]["half/bfloat16"] = lambda: (
    lambda length, d_model: sinusoidal_loops(length,
                                             d_model).bfloat16(),)


@pytest.mark.parametrize("name", ["half", "half/bfloat16"])
def test_half_precision_table_gets_the_dtype_hint(name):
    test_the_planted_mistake_is_refused_with_its_hint("check_sinusoidal",
                                                      name)
    verdict = _check("check_sinusoidal", WRONG["check_sinusoidal"][name]())
    assert "factor" not in verdict.message

# --- chapter 8: more planted mistakes ---


def _mha_forward(how=""):
    """A learner's forward of multi-head attention from its four layers,
    with the mistake ``how`` planted."""
    def forward(layers, num_heads, query, key, value, mask):
        if how == "swapped":
            key, value = value, key
        if how == "keys_from_query":
            key = value = query
        q = layers["q_proj"](query)
        k, v = layers["k_proj"](key), layers["v_proj"](value)
        batch, length, d_model = q.shape
        d_k = d_model // num_heads

        def split(t):
            if how == "split_no_transpose":
                return t.view(batch, num_heads, -1, d_k)
            return t.view(batch, -1, num_heads, d_k).transpose(1, 2)

        scores = split(q) @ split(k).transpose(-2, -1)
        scores = scores / {"scale_d_model": math.sqrt(d_model),
                           "unscaled": 1.0}.get(how, math.sqrt(d_k))
        if mask is not None and how != "no_mask":
            scores = scores.masked_fill(
                mask if how == "inverted" else ~mask,
                float("-inf") if how == "empty_row_nan" else -1e9)
        weights = F.softmax(scores, dim=-2 if how == "softmax_dim" else -1)
        if mask is not None and how not in ("no_mask", "empty_row_nan",
                                            "empty_row_uniform"):
            # a query with no key to attend: zeros (chapter 7)
            weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
        heads = weights @ split(v)
        if how == "merge_no_transpose":
            merged = heads.reshape(batch, length, d_model)
        else:
            merged = heads.transpose(1, 2).reshape(batch, length, d_model)
        if how == "no_out_proj":
            return merged
        out = layers["out_proj"](merged)
        return (out, weights) if how == "pair" else out
    return forward


def _mha_forward_built(layers, num_heads, query, key, value, mask):
    mha = MultiHeadAttention(query.size(-1), num_heads)
    mha.load_state_dict(layers.state_dict())
    return mha(query, key, value, mask=mask)[0]


def _mha_forward_library(layers, num_heads, query, key, value, mask):
    q, k, v = (split_heads(layers[n](t), num_heads) for n, t in (
        ("q_proj", query), ("k_proj", key), ("v_proj", value)))
    heads, _ = scaled_dot_product_attention(q, k, v, mask)
    return layers.out_proj(merge_heads(heads))


WRONG["check_mha_forward"] = {
    name: (lambda name=name: (_mha_forward(name),))
    for name in ("split_no_transpose", "merge_no_transpose", "no_out_proj",
                 "scale_d_model", "unscaled", "softmax_dim", "swapped",
                 "keys_from_query", "no_mask", "inverted", "pair",
                 "empty_row_nan", "empty_row_uniform")}
WRONG["check_mha_forward"]["built_module"] = lambda: (_mha_forward_built,)
RIGHT["check_mha_forward"] = [lambda: (_mha_forward(),),
                              lambda: (_mha_forward_library,)]


# --- chapter 7: more planted mistakes ---


def _safe_softmax_over_queries(scores, mask):
    """-inf fill, the empty rows set to 0 first, then softmax over dim=-2
    and the empty rows zeroed: the axis is wrong, nothing is NaN."""
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, Lq, 1)
    filled = scores.float().masked_fill(~mask, float("-inf"))
    weights = torch.softmax(filled.masked_fill(empty, 0.0), dim=-2)
    return weights.masked_fill(empty, 0.0).to(scores.dtype)


WRONG["check_safe_softmax"]["softmax_dim/zeroed_rows"] = lambda: (
    _safe_softmax_over_queries,)


# --- chapter 12: more planted mistakes ---

WRONG["check_pre_norm"].update({
    "no_residual": lambda: (lambda b, x: (lambda a: b.linear2(
        b.activation(b.linear1(b.norm2(a)))))(
            b.attn(b.norm1(x), need_weights=False)[0]),),
    "stale_ffn_input": lambda: (lambda b, x: x + b.attn(
        b.norm1(x), need_weights=False)[0] + b.linear2(
            b.activation(b.linear1(b.norm2(x)))),),
    "parallel": lambda: (lambda b, x: (lambda n: x + b.attn(
        n, need_weights=False)[0] + b.linear2(
            b.activation(b.linear1(n))))(b.norm1(x)),),
})


# --- chapter 17: more planted mistakes ---

WRONG["check_softcap_score_mod"]["cancelled"] = lambda: (
    lambda c: lambda s, b, h, q, kv: c * torch.tanh(s) / c,)


# --- chapter 13: more planted mistakes ---

WRONG["check_weights_mib"]["one_length"] = lambda: (
    lambda b, n, h, dtype: b * h * n * (torch.finfo(dtype).bits // 8)
    / 2**20,)


# --- chapter 12: more planted mistakes ---

WRONG["check_block_params"]["four_d_model"] = lambda: (
    lambda d, f: block_params(d, 4 * d),)
WRONG["check_pre_norm"]["swapped_norms"] = lambda: (
    lambda b, x: (lambda h: h + b.linear2(b.activation(b.linear1(
        b.norm1(h)))))(x + b.attn(b.norm2(x), need_weights=False)[0]),)


# --- chapter 8: more planted mistakes ---


def _mha_forward_wrong_input(which):
    """The right forward, but one projection reads the wrong input:
    k_proj the query, or v_proj the key."""
    right = _mha_forward()

    def forward(layers, num_heads, query, key, value, mask):
        if which == "k_from_query":
            return right(layers, num_heads, query, query, value, mask)
        return right(layers, num_heads, query, key, key, mask)
    return forward


WRONG["check_mha_forward"].update({
    name: (lambda name=name: (_mha_forward_wrong_input(name),))
    for name in ("k_from_query", "v_from_key")})

WRONG["check_num_parameters"]["head_biases"] = lambda: (
    lambda d, h, bias: 4 * d * d + (4 * (d // h) if bias else 0),)


# --- chapter 7: more planted mistakes ---

WRONG["check_padding_mask"]["additive"] = lambda: (
    lambda lengths, max_len: torch.zeros(len(lengths), 1, 1, max_len)
    .masked_fill(torch.arange(max_len) >= lengths[:, None, None, None],
                 float("-inf")),)

# --- chapter 2: more planted mistakes ---
# a bias per row of the table; the count rounded, in units or millions.
WRONG["check_embedding_parameters"].update({
    "bias/per_row": lambda: (50257 * 768 + 50257,),
    "rounded": lambda: (38_600_000,),
    "rounded/millions": lambda: (38.6,),
    "rounded/float": lambda: (3.8597e7,),
})


# --- chapter 2: more planted mistakes ---
# Exercise 2.1: the right shape, the wrong rows (a scaled table, ids + 1).
WRONG["check_onehot_embedding"].update({
    "wrong_rows": lambda: (lambda ids, w: F.one_hot(
        ids, w.size(0)).float() @ (2 * w),),
    "wrong_rows/shifted": lambda: (lambda ids, w: F.one_hot(
        (ids + 1) % w.size(0), w.size(0)).float() @ w,),
})


# --- chapter 8: more planted mistakes ---

WRONG["check_concat_heads"]["head_axis"] = (  # (B, H, L*D): wrong axes fused
    lambda: (lambda hs: torch.stack(hs, 1).flatten(2),))

# --- chapter 14: more planted mistakes ---
# Exercise 14.2: basic indexing (x[:, :, None]) is a right answer; heads
# picked by number and repeat_interleave are too (see the end).


def test_basic_indexing_with_none_is_still_accepted():
    verdict = _check("check_expand_kv", (
        lambda x, h: x[:, :, None].expand(-1, -1, h // x.size(1), -1, -1)
        .reshape(x.size(0), h, *x.shape[2:]),))
    assert verdict

# --- chapter 18: more planted mistakes ---
# Exercise 18.2: one layer's cache multiplied by DeepSeek-V2's 60 layers.

WRONG["check_latent_cache_bytes"]["all_layers"] = lambda: (
    lambda c, r, length, b, s: 60 * (c + r) * length * b * s,)


def test_sixty_layers_in_the_one_layer_function_is_named():
    verdict = _check("check_latent_cache_bytes",
                     WRONG["check_latent_cache_bytes"]["all_layers"]())
    assert not verdict
    assert "one layer" in verdict.message

# --- chapter 3: more planted mistakes ---
# fairseq's frequency spacing, and positions floor-divided (//).

def _pe_round8(length, d_model, how):
    i = torch.arange(d_model // 2)
    pos = torch.arange(length)[:, None]  # (L, 1)
    if how == "fairseq":
        angles = pos / 10000.0 ** (i / max(d_model // 2 - 1, 1))
    else:
        angles = pos // 10000.0 ** (2 * i / d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


WRONG["check_sinusoidal"].update({
    "fairseq": lambda: (lambda n, d: _pe_round8(n, d, "fairseq"),),
    "floor_division": lambda: (lambda n, d: _pe_round8(n, d, "floor"),),
})


# --- chapter 5: more planted mistakes ---
# Exercise 5.1 with the head count, or the head width, as a number.

WRONG["check_split_heads"].update({
    "heads_fixed": lambda: (
        lambda x, h: x.view(x.size(0), x.size(1), 4, -1).transpose(1, 2),),
    "heads_fixed/head_dim": lambda: (
        lambda x, h: x.view(x.size(0), x.size(1), -1, 2).permute(
            0, 2, 1, 3),),
})

# --- chapter 12: more planted mistakes ---

WRONG["check_pre_norm"].update({
    "swapped_order": lambda: (lambda b, x: (lambda h: h + b.attn(
        b.norm1(h), need_weights=False)[0])(x + b.linear2(
            b.activation(b.linear1(b.norm2(x))))),),
    "swapped_order/norms_too": lambda: (lambda b, x: (lambda h: h + b.attn(
        b.norm2(h), need_weights=False)[0])(x + b.linear2(
            b.activation(b.linear1(b.norm1(x))))),),
})

# --- chapter 1: more planted mistakes ---
# Exercise 1.3: a merge that no catalogued mistake explains still gets the
# section to read, as every other hint does.
def test_bpe_fallback_hint_names_its_section():
    verdict = _check("check_bpe_merges",
                     ([("u", "g"), ("b", "ug"), ("ug", "</w>")],))
    assert not verdict.ok
    assert "(see 'Byte-pair encoding' in chapter 1)" in (
        " ".join(verdict.message.split()))


# --- chapter 2: more planted mistakes ---
# Exercise 2.3: 2 n is also the table's bfloat16 bytes; the hint says both.
def test_twice_the_table_names_bytes_and_untied():
    verdict = _check("check_embedding_parameters", (2 * 50257 * 768,))
    assert not verdict.ok
    assert "bytes" in verdict.message and "untied" in verdict.message

# --- chapter 9: more planted mistakes ---
# Exercise 9.3: the biases forgotten (bias=False always), by
# load_state_dict (d2l's "bias" key is unexpected) or by copy_ of the
# weights; the reverse, bias=True always, by load_state_dict ("bias"
# missing).

def _d2l_to_mha_loaded(d2l, bias):
    mha = MultiHeadAttention(d2l.W_o.out_features, d2l.num_heads, bias=bias)
    for old, new in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"),
                     ("W_o", "out_proj")):
        getattr(mha, new).load_state_dict(getattr(d2l, old).state_dict())
    return mha


WRONG["check_d2l_to_mha"].update({
    "no_bias": lambda: (lambda d: _d2l_to_mha_loaded(d, bias=False),),
    "no_bias/copied": lambda: (lambda d: d2l_to_mha(d, bias=False),),
    "extra_bias/loaded": lambda: (
        lambda d: _d2l_to_mha_loaded(d, bias=True),),
})


# --- chapter 10: more planted mistakes ---
# Exercise 10.2: padding only, left un-broadcast as (B, 1, L): the hint
# names the missing causal part, not only the shape.

WRONG["check_einops_mask"]["padding_only/unbroadcast"] = lambda: (
    lambda v, length: ~padding_mask(v, length)[:, 0],)

# --- chapter 14: more planted mistakes ---
# Exercise 14.2: the final reshape forgotten, (B, H_kv, g, L, D) returned:
# the hint names the group axis left to merge, not only the shape.

WRONG["check_expand_kv"]["no_merge"] = lambda: (
    lambda x, h: x.unsqueeze(2).expand(-1, -1, h // x.size(1), -1, -1),)
# Exercise 14.2: repeat_interleave along the length axis (dim=2), not
# the head axis: (B, H_kv, g L, D); the hint names the axis, not only the
# shape.
WRONG["check_expand_kv"]["length_axis"] = lambda: (
    lambda x, h: x.repeat_interleave(h // x.size(1), dim=2),)


# --- chapter 7: more planted mistakes ---
# Exercise 7.3: the scores multiplied by the mask (hidden scores 0, which
# still get weight), with or without the empty rows zeroed afterwards.
WRONG["check_safe_softmax"].update({
    "multiplied": lambda: (lambda s, m: torch.softmax(s * m, dim=-1),),
    "multiplied/empty_zeroed": lambda: (
        lambda s, m: torch.softmax(s * m, dim=-1).masked_fill(
            ~m.any(dim=-1, keepdim=True), 0.0),),
})


@pytest.mark.parametrize("name", ["multiplied", "multiplied/empty_zeroed"])
def test_chapter7_multiplied_mask_has_its_own_hint(name):
    verdict = _check("check_safe_softmax", WRONG["check_safe_softmax"][name]())
    assert not verdict
    assert CATALOGUE["check_safe_softmax"]["multiplied"].hint in (
        verdict.message)
    assert "finite fill" not in verdict.message


# --- chapter 1: more planted mistakes ---
# Exercise 1.3: a stale second merge gets an example of its own merge, not
# merge 3's answer; a wrong first merge gets the counts (15 against 21).
WRONG["check_bpe_merges"].update({
    "stale_pair/second": lambda: ([("u", "g"), ("g", "</w>"), ("u", "n")],),
})


def test_stale_second_merge_shows_its_own_word():
    verdict = _check("check_bpe_merges",
                     ([("u", "g"), ("g", "</w>"), ("u", "n")],))
    message = " ".join(verdict.message.split())
    assert not verdict.ok
    assert "after the merge ('u', 'g'), pug is p ug </w>" in message
    assert "ug</w>" not in message


def test_wrong_first_merge_names_the_counts():
    verdict = _check("check_bpe_merges",
                     ([("g", "</w>"), ("u", "g"), ("ug", "</w>")],))
    message = " ".join(verdict.message.split())
    assert not verdict.ok
    assert "counted 15 times" in message and "21 times" in message
    assert "merges before it" not in message


# --- chapter 3: more planted mistakes ---
# Exercise 3.2: the identity (no move at all) and the frequencies in
# reverse order (pair 0 slowest) get hints of their own.

WRONG["check_shift_matrix"].update({
    "identity": lambda: (torch.eye(8),),
    "reversed_frequencies": lambda: (
        torch.block_diag(*[shift()[2 * j:2 * j + 2, 2 * j:2 * j + 2]
                           for j in reversed(range(4))]),),
})


# --- chapter 10: more planted mistakes ---
# Exercise 10.2: the diagonal blocked too (triu(0) for the future), so a
# token cannot attend to itself.

WRONG["check_einops_mask"]["diagonal_blocked"] = lambda: (
    lambda v, length: ~(padding_mask(v, length)[:, 0]
                        & torch.ones(length, length, dtype=torch.bool)
                        .triu(0).logical_not()),)

# --- chapter 12: more planted mistakes ---
# Exercise 12.2: a causal mask applied although the task has none, and the
# FFN fed attention's output instead of the updated stream.

WRONG["check_pre_norm"].update({
    "causal_mask": lambda: (lambda b, x: (lambda h: h + b.linear2(
        b.activation(b.linear1(b.norm2(h)))))(x + b.attn(
            b.norm1(x), need_weights=False, is_causal=True)[0]),),
    "causal_mask/mask": lambda: (lambda b, x: (lambda h: h + b.linear2(
        b.activation(b.linear1(b.norm2(h)))))(x + b.attn(
            b.norm1(x), mask=causal_mask(x.size(1)),
            need_weights=False)[0]),),
    "attn_output_ffn": lambda: (lambda b, x: (lambda a: x + a + b.linear2(
        b.activation(b.linear1(b.norm2(a)))))(b.attn(
            b.norm1(x), need_weights=False)[0]),),
})

# --- chapter 4: more planted mistakes ---
# Exercise 4.2: the fused output split every third feature (interleaved)
# instead of in three contiguous blocks; Exercise 4.3: one bias vector
# counted for the three layers.

WRONG["check_fused_projection"].update({
    "interleaved": lambda: (lambda x, m: (lambda y: y.view(
        *y.shape[:-1], m.d_model, 3).unbind(-1))(
            x @ _stack(m)[0].T + _stack(m)[1]),),
    "interleaved/slices": lambda: (lambda x, m: (lambda y: (
        y[..., 0::3], y[..., 1::3], y[..., 2::3]))(
            x @ _stack(m)[0].T + _stack(m)[1]),),
})
WRONG["check_projection_parameters"]["one_bias"] = lambda: (
    3 * 512 * 512 + 512,)

# --- chapter 2: more planted mistakes ---
# Exercise 2.3: the second answer (the size in megabytes) given for the
# first (the number of parameters).
WRONG["check_embedding_parameters"].update({
    "megabytes": lambda: (77.2,),
    "megabytes/exact": lambda: (2 * 50257 * 768 / 1e6,),
    "megabytes/float32": lambda: (154.4,),
    "megabytes/mib": lambda: (73.6,),
})

# --- chapter 11: more planted mistakes ---
# out_proj copied transposed; the kernel's dropout left on for a module
# without dropout.

def _to_torch_out_transposed(m):
    t = my_to_torch(m)
    with torch.no_grad():
        t.out_proj.weight.copy_(m.out_proj.weight.T)
    return t


def _sdpa_dropout_on(m, x, mask=None):
    q, k, v = (split_heads(p(x), m.num_heads)
               for p in (m.q_proj, m.k_proj, m.v_proj))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=0.1)
    return m.out_proj(merge_heads(heads))


WRONG["check_to_torch"]["out_proj_transposed"] = lambda: (
    _to_torch_out_transposed,)
WRONG["check_sdpa_attention"]["dropout"] = lambda: (_sdpa_dropout_on,)

# --- chapter 3: more planted mistakes ---
# Exercise 3.1 with the column index j in the exponent, 2j / d_model.

def _pe_column_index_2j(length, d_model):
    j = torch.arange(d_model)  # column index, not the pair index
    pos = torch.arange(length)[:, None]  # (L, 1)
    angles = pos / 10000.0 ** (2 * j / d_model)  # (L, d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = angles[:, 0::2].sin()
    pe[:, 1::2] = angles[:, 1::2].cos()
    return pe


WRONG["check_sinusoidal"]["column_index_2j"] = lambda: (
    _pe_column_index_2j,)

# --- chapter 4: more planted mistakes ---
# Exercise 4.2 split per head, as UvA's fused qkv_proj is.

WRONG["check_fused_projection"]["per_head"] = lambda: (
    lambda x, m: (x @ _stack(m)[0].T + _stack(m)[1]).reshape(
        *x.shape[:-1], m.num_heads, -1).chunk(3, dim=-1),)

# --- chapter 5: more planted mistakes ---
# Exercise 5.1 with the batch axis swapped for the heads.

WRONG["check_split_heads"]["batch_swapped"] = lambda: (
    lambda x, h: x.view(*x.shape[:-1], h, -1).transpose(0, 2),)

# --- chapter 13: more planted mistakes ---
# Exercise 13.3: a fixed reference (the first block's max, or the first
# score) instead of the running max; the correction flipped; pass 2 with
# each block's own max.

def tiled_softmax_variant(scores, block_size, how):
    blocks = scores.split(block_size, dim=-1)
    first = blocks[0].amax(dim=-1, keepdim=True)
    m = {"first_score": scores[..., :1], "first_block": first,
         "flipped_from_first": first}.get(how, torch.full_like(first, INF))
    total = torch.zeros_like(first)
    for block in blocks:
        if how in ("first_score", "first_block"):
            total = total + torch.exp(block - m).sum(dim=-1, keepdim=True)
            continue
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        correction = torch.exp(m - m_new) if how == "block_max" \
            else torch.exp(m_new - m)
        total = correction * total + torch.exp(block - m_new).sum(
            dim=-1, keepdim=True)
        m = m_new
    if how == "block_max":
        return torch.cat([torch.exp(b - b.amax(dim=-1, keepdim=True)) / total
                          for b in blocks], dim=-1)
    return torch.cat([torch.exp(b - m) / total for b in blocks], dim=-1)


WRONG["check_tiled_softmax"].update({
    name: (lambda how=how: (lambda s, b: tiled_softmax_variant(s, b, how),))
    for name, how in (("fixed_reference", "first_block"),
                      ("fixed_reference/first_score", "first_score"),
                      ("flipped_correction", "flipped"),
                      ("flipped_correction/from_first", "flipped_from_first"),
                      ("block_max", "block_max"))})

# --- chapter 13: more planted mistakes ---
# Exercise 13.4: the sum and the output not rescaled when the max grows,
# with each tile's own max or with the running one.

def masked_tiles_unscaled(q, k, v, mask, block_size, own_max):
    outs = []
    for r, qb in zip(range(0, q.size(-2), block_size),
                     q.split(block_size, dim=-2), strict=True):
        m = qb.new_full((*qb.shape[:-1], 1), INF)
        total = qb.new_zeros((*qb.shape[:-1], 1))
        o = qb.new_zeros((*qb.shape[:-1], v.size(-1)))
        for c in range(0, k.size(-2), block_size):
            tile = mask[r:r + qb.size(-2), c:c + block_size]
            s = (qb @ k[..., c:c + block_size, :].mT / 2).masked_fill(~tile, INF)
            top = s.amax(dim=-1, keepdim=True)
            m = top if own_max else torch.maximum(m, top)
            p = torch.exp(s - m.masked_fill(m == INF, 0.0))
            total, o = total + p.sum(-1, keepdim=True), o + p @ v[..., c:c + block_size, :]
        outs.append(torch.where(total > 0, o / total.clamp_min(1e-30), 0.0))
    return torch.cat(outs, dim=-2)


WRONG["check_masked_tiles"].update({
    "no_rescale": lambda: (lambda *a: masked_tiles_unscaled(*a, own_max=True),),
    "no_rescale/running": lambda: (lambda *a: masked_tiles_unscaled(*a, own_max=False),),
})

# --- chapter 6: more planted mistakes ---
# Exercise 6.1: the scale applied to the weights after the softmax (each
# row then sums to 1 / sqrt(d_k)).
WRONG["check_attention"]["after_softmax"] = lambda: (
    lambda q, k, v: (lambda w: (w @ v, w))(
        torch.softmax(q @ k.mT, dim=-1) / math.sqrt(q.size(-1))),)

# --- chapter 11: more planted mistakes ---
# Exercise 11.3: the kernel's dropout_p = m.dropout also in eval mode;
# a finite fill (-1e9) for the blocked scores, so a query with no key
# gets the average of all values.

def _sdpa_dropout_always(m, x, mask=None):
    q, k, v = (split_heads(p(x), m.num_heads)
               for p in (m.q_proj, m.k_proj, m.v_proj))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=m.dropout)
    return m.out_proj(merge_heads(heads))


def _sdpa_finite_fill(m, x, mask=None):
    q, k, v = (split_heads(p(x), m.num_heads)
               for p in (m.q_proj, m.k_proj, m.v_proj))
    if mask is not None:
        mask = torch.zeros(mask.shape).masked_fill(~mask, -1e9)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return m.out_proj(merge_heads(heads))


WRONG["check_sdpa_attention"]["dropout_in_eval"] = lambda: (
    _sdpa_dropout_always,)
WRONG["check_sdpa_attention"]["finite_fill"] = lambda: (_sdpa_finite_fill,)

# --- chapter 10: more planted mistakes ---
# Exercise 10.2: the causal mask transposed (the past blocked);
# Exercise 10.3: the factor n_head forgotten (one head's sizes), with or
# without fc's n_head * d_v inputs.

WRONG["check_einops_mask"]["causal_transposed"] = lambda: (
    lambda n, length: ~(padding_mask(n, length)[:, 0]
                        & causal_mask(length).T),)
WRONG["check_einsum_num_parameters"]["one_head"] = lambda: (
    lambda h, d, dk, dv: (d + 1) * (2 * dk + dv) + (dv + 1) * d + 2 * d,)
WRONG["check_einsum_num_parameters"]["one_head/fc_heads"] = lambda: (
    lambda h, d, dk, dv: (d + 1) * (2 * dk + dv) + (h * dv + 1) * d
    + 2 * d,)

# --- chapter 2: more planted mistakes ---
# Exercise 2.1: the one-hot cast with .float(), not to the table's dtype
# (the float64 table of the last case).
WRONG["check_onehot_embedding"]["not_cast/float32"] = lambda: (
    lambda ids, w: F.one_hot(ids, w.size(0)).float() @ w,)

# --- chapter 12: more planted mistakes ---
# Exercise 12.1: the FFN's biases counted as d_ff twice, or as d_model
# twice.
WRONG["check_block_params"].update({
    "ffn_bias_sizes": lambda: (lambda d, f: block_params(d, f) + f - d,),
    "ffn_bias_sizes/d_model": lambda: (
        lambda d, f: block_params(d, f) - f + d,),
})

# --- chapter 15: more planted mistakes ---
# Exercise 15.2: a softmax before F.cross_entropy; Exercise 15.4: the
# layer counted from 1 (the head from 0, or from 1 too).
WRONG["check_answer_loss"]["softmax_first"] = lambda: (
    lambda lg, s: F.cross_entropy(lg[:, N:].softmax(-1).flatten(0, 1),
                                  s[:, N + 1:].flatten()),)
WRONG["check_find_induction_head"].update({
    "one_based": lambda: (
        lambda w, k: (lambda lh: (lh[0] + 1, lh[1]))(
            best(head_score(w, k))),),
    "one_based/both": lambda: (
        lambda w, k: (lambda lh: (lh[0] + 1, lh[1] + 1))(
            best(head_score(w, k))),),
})


def _remove_head_also(model, head, how):
    """Exercise 15.3's classic slips the planted remove_head lacks."""
    with torch.no_grad():
        for block in model.blocks:
            d = block.attn.head_dim
            part = slice(head * d, (head + 1) * d)
            if how == "query_weight":  # q_proj's rows, its bias left
                block.attn.q_proj.weight[part] = 0.0
            else:  # the right columns, and the shared out_proj.bias
                block.attn.out_proj.weight[:, part] = 0.0
                block.attn.out_proj.bias.zero_()


# Exercise 15.3: only q_proj's weight rows zeroed; out_proj.bias zeroed
# with the head's columns.
WRONG["check_remove_head"].update({
    "query_rows/weights_only": lambda: (
        lambda m, h: _remove_head_also(m, h, "query_weight"),),
    "out_bias": lambda: (lambda m, h: _remove_head_also(m, h, "bias"),),
})

# Exercise 15.4: every sequence scored with the first sequence's k.
WRONG["check_find_induction_head"]["first_k"] = lambda: (
    lambda w, k: best(head_score(w, k[:1])),)

# --- chapter 14: more planted mistakes ---
# Exercise 14.3: the right mask as ints; the hint names its section.
WRONG["check_chunk_mask"]["not_bool"] = lambda: (
    lambda q, p: (torch.arange(p + q)[None]
                  <= p + torch.arange(q)[:, None]).int(),)


def test_int_chunk_mask_hint_points_at_its_section():
    verdict = _check("check_chunk_mask", (
        lambda q, p: (torch.arange(p + q)[None]
                      <= p + torch.arange(q)[:, None]).float(),))
    assert not verdict
    assert "in chapter 14)" in verdict.message

# --- chapter 1: more planted mistakes ---
# Exercise 1.1: split(" ") with the empty tokens filtered out (not
# split() without an argument, which also splits at a tab).
WRONG["check_tokenizer"]["dropped_empty"] = lambda: (lambda t: [
    w for w in tokenize(t.replace(",", "")) if w],)

# --- chapter 2: more planted mistakes ---
# Exercise 2.2: <pad> put last (padding_idx=14); Exercise 2.3: GPT-2's
# position table (1,024 x 768) instead of its token table.
WRONG["check_padding_embedding"]["pad_id_other"] = lambda: _embedding(
    padding_idx=14)
WRONG["check_embedding_parameters"]["position_table"] = lambda: (
    1024 * 768,)

# --- chapter 4: more planted mistakes ---
# Exercise 4.4: random layers (biases and all) match no catalogued mistake;
# the hint still names the section to read.
def test_previous_token_fallback_hint_names_its_section():
    torch.manual_seed(0)
    q, k = nn.Linear(8, 8), nn.Linear(8, 8)
    verdict = _check("check_previous_token", (q, k))
    assert not verdict.ok
    assert "(see 'The projections at work' in chapter 4)" in (
        " ".join(verdict.message.split()))

# --- chapter 6: more planted mistakes ---
# Exercise 6.3: diag(p (1 - p)), the right diagonal with nothing off it.
WRONG["check_softmax_jacobian"]["diagonal_right"] = lambda: (
    lambda s: torch.diag(s.softmax(-1) * (1 - s.softmax(-1))),)

# --- chapter 17: more planted mistakes ---
# Exercise 17.4: the score divided by D (not its root) inside the tanh.
WRONG["check_softcap_score_mod"]["scaled_again/by_d"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: cap * torch.tanh(s / 8 / cap),)

# --- chapter 11: more planted mistakes ---
# Exercise 11.3: the kernel's row for a query with no key kept as it is
# (zeros on the CPU, finite non-zero values from cuDNN on an H200), with
# the bool mask or an additive -inf one; right: that row zeroed after
# the kernel.

def _sdpa_rows(m, x, mask=None, how="kept"):
    q, k, v = (split_heads(p(x), m.num_heads)
               for p in (m.q_proj, m.k_proj, m.v_proj))
    given = mask
    if mask is not None and how == "additive":
        given = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=given)
    if mask is not None and how == "zeroed":
        heads = heads.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return m.out_proj(merge_heads(heads))


WRONG["check_sdpa_attention"]["not_zeroed"] = lambda: (_sdpa_rows,)
WRONG["check_sdpa_attention"]["not_zeroed/additive"] = lambda: (
    lambda m, x, mask=None: _sdpa_rows(m, x, mask, "additive"),)
RIGHT["check_sdpa_attention"].append(lambda: (
    lambda m, x, mask=None: _sdpa_rows(m, x, mask, "zeroed"),))

# --- chapter 17: more planted mistakes ---
# Exercise 17.1 (a window within each packed document) and Exercise 17.3
# (bidirectional ALiBi), which replaced a window alone and the reach.


def doc_window(document_id, window, how="right"):
    def mask_mod(b, h, q_idx, kv_idx):
        same = document_id[q_idx] == document_id[kv_idx]
        if how == "and":
            return same and (q_idx >= kv_idx) and (q_idx - kv_idx < window)
        if how == "both_ways":
            return same & ((q_idx - kv_idx).abs() < window)
        near = {"right": q_idx - kv_idx < window, "more": q_idx - kv_idx <= window,
                "less": q_idx - kv_idx < window - 1}.get(how, q_idx - kv_idx < window)
        past = q_idx >= kv_idx
        allowed = {"future": same & near, "leak": past & near,
                   "no_window": same & past}.get(how, same & past & near)
        return ~allowed if how == "inverted" else allowed
    return mask_mod


def doc_window_where(document_id, window):  # kv in (q - window, q]
    def mask_mod(b, h, q, kv):
        near = torch.where(kv <= q, kv > q - window, False)
        return near & (document_id[kv] == document_id[q])
    return mask_mod


def bi_alibi(slopes, how="right"):
    def score_mod(score, b, h, q_idx, kv_idx):
        distance = (q_idx - kv_idx).abs()
        if how == "sign":
            return score + slopes[h] * distance
        if how == "one_sided":
            return score + slopes[h] * (kv_idx - q_idx)
        if how == "key_only":
            return score + slopes[h] * kv_idx
        if how == "one_slope":
            return score - slopes[0] * distance
        if how == "no_score":
            return -slopes[h] * distance
        if how == "math":
            return score - slopes[h] * math.fabs(q_idx - kv_idx)
        return score - slopes[h] * distance
    return score_mod


RIGHT["check_document_window_mod"] = [lambda: (doc_window,),
                                      lambda: (doc_window_where,)]
WRONG["check_document_window_mod"] = {
    name: (lambda how=how: (lambda d, w: doc_window(d, w, how),))
    for name, how in (("one_too_many", "more"), ("one_too_few", "less"),
                      ("future", "future"), ("future/both_ways", "both_ways"),
                      ("leak", "leak"), ("no_window", "no_window"),
                      ("inverted", "inverted"), ("python_and", "and"))}
RIGHT["check_bidirectional_alibi"] = [
    lambda: (bi_alibi,),
    lambda: (lambda s: lambda score, b, h, q, kv: score - s[h] * abs(q - kv),)]
WRONG["check_bidirectional_alibi"] = {
    name: (lambda how=how: (lambda s: bi_alibi(s, how),))
    for name, how in (("sign", "sign"), ("one_sided", "one_sided"),
                      ("one_sided/key_only", "key_only"),
                      ("one_slope", "one_slope"), ("no_score", "no_score"),
                      ("python_math", "math"))}

# --- chapter 13: more planted mistakes ---
# Exercise 13.1: the arithmetic intensity of Q K^T, right in two styles
# and with each classic mistake of the catalogue.
def _intensity(b, length, d, h, dtype, mistake=""):
    size = torch.finfo(dtype).bits // 8
    if mistake == "bits":
        size = torch.finfo(dtype).bits
    elif mistake == "float32_assumed":
        size = 4
    elif mistake == "numbers_not_bytes":
        size = 1
    head_dim = d if mistake == "heads_times_d_model" else d // h
    flops = (1 if mistake == "multiply_add_once" else 2) * (
        b * h * length * length * head_dim)
    square = {"result_forgotten": 0, "result_twice": 2}.get(mistake, 1) * (
        b * h * length ** 2)
    moved = (2 * b * length * d + square) * size
    return moved / flops if mistake == "inverted" else flops / moved


RIGHT["check_score_intensity"] = [
    lambda: (_intensity,),
    lambda: (lambda b, length, d, h, dtype: 2 * length * (d // h) / (
        torch.empty((), dtype=dtype).element_size()
        * (length + 2 * (d // h))),),
]


def _planted_intensity(mistake):
    def wrong(b, length, d, h, dtype):
        return _intensity(b, length, d, h, dtype, mistake)
    return lambda: (wrong,)


WRONG["check_score_intensity"] = {
    name: _planted_intensity(name)
    for name in ("multiply_add_once", "heads_times_d_model",
                 "result_forgotten", "result_twice", "numbers_not_bytes",
                 "bits", "float32_assumed", "inverted")
}


def test_score_intensity_reports_the_first_case_when_no_mistake_fits():
    verdict = _check("check_score_intensity", (lambda *args: 7.0,))
    assert not verdict and "fn(3, 6, 8, 4, torch.float32)" in verdict.message

# --- chapter 6: more planted mistakes ---
# Exercise 6.1: k.transpose(1, 2), H and Lk swapped instead of Lk and D.
WRONG["check_attention"]["transposed_batch_axis"] = lambda: (
    lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(
        q @ k.transpose(1, 2) / math.sqrt(q.size(-1)), -1)),)

# --- chapter 8: more planted mistakes ---
# Exercise 8.1: the heads stacked on a new axis, never joined.
WRONG["check_concat_heads"]["stacked"] = lambda: (
    lambda hs: torch.stack(hs, 1),)
# Exercise 8.3: d_model biases per layer for every head.
WRONG["check_num_parameters"]["bias_per_head"] = lambda: (
    lambda d, h, bias=True: 4 * d * d + (4 * d * h if bias else 0),)

# Exercise 15.1: the separator left out (12 tokens); Exercise 15.2:
# F.nll_loss on probabilities (a softmax, no log).
WRONG["check_copy_batch"]["no_separator/dropped"] = lambda: (
    lambda n, g: (lambda d: torch.cat([d, d], dim=1))(
        torch.randint(10, (n, N), generator=g)),)
WRONG["check_answer_loss"]["nll_on_logits/probabilities"] = lambda: (
    lambda lg, s: F.nll_loss(lg[:, N:].softmax(-1).flatten(0, 1),
                             s[:, N + 1:].flatten()),)


# --- chapter 16: more planted mistakes ---
WRONG["check_rotate_half"]["adjacent_halves"] = lambda: (
    lambda x: torch.cat([-x[..., 1::2], x[..., 0::2]], -1),)
WRONG["check_unturned_pairs"]["fraction"] = lambda: (
    lambda d, b, n: unturned(d, b, n) / (d // 2),)


# --- chapter 17: more planted mistakes ---
# Exercise 17.3: the key-only form has its own hint now, told apart from
# the signed decoder bias by the raw scores (the softmax cannot).
_KEY_ONLY = WRONG["check_bidirectional_alibi"].pop("one_sided/key_only")
WRONG["check_bidirectional_alibi"]["key_only"] = _KEY_ONLY


# --- chapter 13: more planted mistakes ---
# Exercise 13.1: the scores S counted for one head in the bytes.
def _intensity_one_head_scores(b, length, d, h, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    flops = 2 * b * h * length ** 2 * (d // h)
    return flops / ((2 * b * length * d + b * length ** 2) * size)


WRONG["check_score_intensity"]["result_one_head"] = lambda: (
    _intensity_one_head_scores,)


# --- chapter 3: more planted mistakes ---
# a table built for the running example's size alone (6 positions or
# d_model = 8 written as numbers) gets the hard-coded hint, not a shape.

WRONG["check_sinusoidal"]["hard_coded"] = lambda: (
    lambda length, d_model: sinusoidal_power(length, 8),)
WRONG["check_sinusoidal"]["hard_coded/both"] = lambda: (
    lambda length, d_model: sinusoidal_power(6, 8),)


# --- chapter 1: more planted mistakes ---
# Exercise 1.1: commas stripped at the ends of the tokens of str.split()
# (both mistakes in one answer, both named).
WRONG["check_tokenizer"]["strip_and_split"] = lambda: (lambda t: [
    w.strip(",").lower() for w in re.sub(r"[!.?]", "", t).split()],)

# --- chapter 2: more planted mistakes ---
# Exercise 2.2: padding_idx=1, the row of the word "a" (not the last row).
WRONG["check_padding_embedding"]["pad_id_word"] = lambda: _embedding(
    padding_idx=1)


def test_pad_id_on_a_word_names_the_word_not_the_last_row():
    verdict = _check("check_padding_embedding",
                     WRONG["check_padding_embedding"]["pad_id_word"]())
    assert "the row of 'a'" in verdict.message
    assert "last row" not in verdict.message

# --- chapter 4: more planted mistakes ---
# Exercise 4.4: the step on the key layer with the wrong sign
# (k_proj.weight = 10 M, W^K = 10 M^T): the hint names k_proj, not q_proj.
WRONG["check_previous_token"]["next_token_key"] = lambda: (
    _layer(torch.eye(8)), _layer(10 * _one_step_back().T))

# --- chapter 5: more planted mistakes ---
# Exercise 5.2: the block sliced on the wrong axis, positions instead of
# features (x[:, h*D:(h+1)*D]).
WRONG["check_head_columns"]["wrong_axis"] = lambda: (
    lambda x, h, n: x[:, h * (x.size(-1) // n):(h + 1) * (x.size(-1) // n)],)


# --- chapter 13: more planted mistakes ---
# Exercise 13.1: the FLOPs of one head (H dropped) and the bytes in bits
# get different hints: no probe has H = 8, where the two numbers agree.
def _intensity_flops_of_one_head(b, length, d, h, dtype):
    size = torch.finfo(dtype).bits // 8
    flops = 2 * b * length ** 2 * (d // h)  # the factor H dropped
    return flops / ((2 * b * length * d + b * h * length ** 2) * size)


WRONG["check_score_intensity"]["one_head"] = lambda: (
    _intensity_flops_of_one_head,)


def test_one_head_and_bits_get_their_own_hints():
    verdict = _check("check_score_intensity",
                     WRONG["check_score_intensity"]["one_head"]())
    hints = CATALOGUE["check_score_intensity"]
    assert hints["one_head"].message in verdict.message
    assert hints["bits"].message not in verdict.message
    verdict = _check("check_score_intensity",
                     WRONG["check_score_intensity"]["bits"]())
    assert hints["bits"].message in verdict.message


# --- chapter 7: more planted mistakes ---
# Exercise 7.3: the hidden scores filled with 0 (not -inf) are the scores
# multiplied by the mask, and get that hint, which names both.
WRONG["check_safe_softmax"]["multiplied/filled_zero"] = lambda: (
    lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), dim=-1),)


def test_chapter7_zero_fill_gets_the_multiplied_hint():
    verdict = _check("check_safe_softmax",
                     WRONG["check_safe_softmax"]["multiplied/filled_zero"]())
    assert not verdict
    hint = CATALOGUE["check_safe_softmax"]["multiplied"].hint
    assert hint in verdict.message and "filled with 0" in hint


# --- chapter 16: more planted mistakes ---
# Exercise 16.3: the wavelength compared with length, not length - 1.
WRONG["check_unturned_pairs"]["off_by_one"] = lambda: (
    lambda d, b, n: unturned(d, b, n + 1),)


# --- chapter 14: more planted mistakes ---
# Exercise 14.2: right values built another way (repeat_interleave, heads
# picked by number) are accepted, with a nudge towards expand.
@pytest.mark.parametrize("answer", [
    lambda x, h: x.repeat_interleave(h // x.size(1), 1),
    lambda x, h: x[:, torch.arange(h) // (h // x.size(1))],
    lambda x, h: x[:, [i // (h // x.size(1)) for i in range(h)]],
    lambda x, h: x.index_select(1, torch.arange(h) // (h // x.size(1))),
])
def test_expand_kv_built_another_way_is_accepted(answer):
    verdict = _check("check_expand_kv", (answer,))
    assert verdict
    assert "another way" in verdict.message


def test_expand_kv_unsqueeze_expand_reshape_gets_no_nudge():
    verdict = _check("check_expand_kv", (expand_kv,))
    assert verdict
    assert "another way" not in verdict.message


# --- chapter 15: more planted mistakes ---
# Exercise 15.2: (B, N, V) logits passed to F.cross_entropy unflattened
# (it raises; the hint names the class dimension). Exercise 15.4: every
# query scored, not only the second copy's.
WRONG["check_answer_loss"].update({
    "unflattened": lambda: (
        lambda lg, s: F.cross_entropy(lg[:, N:], s[:, N + 1:]),),
    "unflattened/targets": lambda: (
        lambda lg, s: F.cross_entropy(lg[:, N:].flatten(0, 1),
                                      s[:, N + 1:]),),
})


def _score_every_query(weights, k):
    """Exercise 15.4 with the second-copy mask left out."""
    num_layers, batch, num_heads, length, _ = weights.shape
    target = (torch.arange(length) - k + 1).clamp(min=0)  # (B, L)
    index = target[None, :, None, :, None].expand(
        num_layers, batch, num_heads, length, 1)
    return best(weights.gather(-1, index)[..., 0].sum(dim=(1, 3)))


WRONG["check_find_induction_head"]["all_queries"] = lambda: (
    _score_every_query,)


# --- chapter 10: more planted mistakes (round 20) ---
# Exercise 10.3: the value projection w_vs counted with d_k (fc still
# from n_head * d_v): the classic d_k = d_v slip, named.
WRONG["check_einsum_num_parameters"]["values_d_k/w_vs_only"] = lambda: (
    lambda h, d, dk, dv: (3 * (d * h * dk + h * dk) + h * dv * d + d
                          + 2 * d),)

# --- chapter 6: more planted mistakes (round 20) ---
# Exercises 6.1 and 6.2: an answer that returns the output alone, not the
# pair (output, weights), is told so with a pointer to the section.
def _output_only(q, k, v, tau=1.0):
    scale = (tau * math.sqrt(q.size(-1))) ** -1
    return torch.softmax(q @ k.mT * scale, dim=-1) @ v


@pytest.mark.parametrize("checker", ["check_attention", "check_temperature"])
def test_an_output_only_answer_gets_a_pointer(checker):
    verdict = _check(checker, (_output_only,))
    assert not verdict
    section = "All steps in one function, checked twice"
    assert section in _headings(6)
    assert f"got Tensor (see '{section}' in chapter 6)" in " ".join(
        verdict.message.split())

# --- chapter 18: more planted mistakes (round 20) ---
# Exercise 18.1: each head's block reshaped to (C, D) and transposed (the
# transposed hint names it); the heads merged before the product.
# Exercise 18.3: kv_down.weight alone, or k_up.weight alone.
WRONG["check_absorbed_query"].update({
    "transposed/reshaped": lambda: (
        lambda q, w, h: q @ w.reshape(h, w.size(1), -1).mT,),
    "heads_merged": lambda: (
        lambda q, w, h: q.transpose(1, 2).flatten(2) @ w,),
})
WRONG["check_key_projection"].update({
    "latent_only": lambda: (lambda m: m.kv_down.weight,),
    "up_only": lambda: (lambda m: m.k_up.weight,),
})


# --- chapter 8: more planted mistakes (round 20) ---
# Exercise 8.4: both reshapes without their transpose, the split
# straight to (B, H, L, D) and the merge straight back.


def _mha_forward_both_no_transpose(layers, num_heads, query, key, value,
                                   mask):
    q, k, v = (layers[n](t) for n, t in (
        ("q_proj", query), ("k_proj", key), ("v_proj", value)))
    batch, length, d_model = q.shape
    d_k = d_model // num_heads
    split = lambda t: t.view(batch, num_heads, -1, d_k)  # noqa: E731
    scores = split(q) @ split(k).transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        empty = ~mask.any(-1, keepdim=True)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.masked_fill(empty, 0.0).softmax(-1)
        weights = weights.masked_fill(empty, 0.0)
    else:
        weights = scores.softmax(-1)
    merged = (weights @ split(v)).reshape(batch, length, d_model)
    return layers["out_proj"](merged)


WRONG["check_mha_forward"]["both_no_transpose"] = lambda: (
    _mha_forward_both_no_transpose,)

# --- chapter 1: more planted mistakes (round 22) ---
# Exercise 1.1: a tokenizer that also deletes ; or : or " (each alone).
# Exercise 1.2: rows padded to 6, the running example's length, not to 4.
def _tokenize_deleting(mark):
    return lambda t: tokenize(t.replace(",", "").replace(mark, ""))


WRONG["check_tokenizer"].update({
    "too_much_removed/semicolon": lambda: (_tokenize_deleting(";"),),
    "too_much_removed/colon": lambda: (_tokenize_deleting(":"),),
    "too_much_removed/quote": lambda: (_tokenize_deleting('"'),),
})
WRONG["check_padded_batch"]["padded_too_far"] = lambda: (
    [[12, 13, 3, 8, 0, 0], [1, 2, 10, 0, 0, 0]], [4, 3])


# --- chapter 7: more planted mistakes (round 22) ---
# Exercise 7.3: the 0/1 keep mask added to the scores as a float, the
# mistake chapter 7's "Float masks" warning names, with or without the
# empty rows zeroed afterwards.
WRONG["check_safe_softmax"].update({
    "float_mask": lambda: (
        lambda s, m: torch.softmax(s + m.float(), dim=-1),),
    "float_mask/empty_zeroed": lambda: (
        lambda s, m: torch.softmax(s + m.to(s.dtype), dim=-1).masked_fill(
            ~m.any(dim=-1, keepdim=True), 0.0),),
})


@pytest.mark.parametrize("name", ["float_mask", "float_mask/empty_zeroed"])
def test_chapter7_added_float_mask_gets_its_own_hint(name):
    verdict = _check("check_safe_softmax", WRONG["check_safe_softmax"][name]())
    assert not verdict
    hint = CATALOGUE["check_safe_softmax"]["float_mask"]
    assert hint.message in verdict.message and "blocks nothing" in hint.hint
    assert "finite fill" not in verdict.message
    assert hint.section == "Float masks"


# Exercise 7.3: the NaN of an empty row replaced by 1/Lk (a uniform row)
# gets its own hint (round 26: the finite-fill hint no longer names it).
WRONG["check_safe_softmax"]["nan_to_uniform"] = lambda: (
    lambda s, m: torch.softmax(s.masked_fill(~m, INF), dim=-1).nan_to_num(
        1.0 / s.shape[-1]),)


def test_chapter7_nan_made_uniform_gets_its_own_hint():
    verdict = _check("check_safe_softmax",
                     WRONG["check_safe_softmax"]["nan_to_uniform"]())
    assert not verdict
    hint = CATALOGUE["check_safe_softmax"]["nan_to_uniform"].hint
    assert hint in verdict.message and "nan_to_num(1/Lk)" in hint
    assert "finite fill" not in verdict.message

# --- chapter 8: more planted mistakes (round 22) ---
# Exercise 8.1: the heads stacked on dim 0, (H, B, L, D), then reshaped.
# Exercise 8.2: the padding mask on the query axis, pad.mT & causal (the
# same output as masking the pads' rows on top of the right mask).

WRONG["check_concat_heads"].update({
    "stack_first": lambda: (lambda hs: torch.stack(hs, 0).reshape(
        hs[0].shape[0], hs[0].shape[1], -1),),
    "stack_first/view": lambda: (lambda hs: torch.stack(hs).view(
        hs[0].shape[0], hs[0].shape[1], -1),),
})
WRONG["check_masked_self_attention"].update({
    "query_axis": lambda: _mha_output(lambda p, c: c & p.transpose(-1, -2)),
    "query_axis/both": lambda: _mha_output(lambda p, c: p & p.mT & c),
})

# --- chapter 13: more planted mistakes (round 22) ---
# Exercise 13.1: V's bytes counted as read by Q K^T too; Exercise 13.2:
# integer division by 2**20 (0 MiB for the running example's weights).
def _intensity_value_counted(b, length, d, h, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    flops = 2 * b * h * length ** 2 * (d // h)
    return flops / ((3 * b * length * d + b * h * length ** 2) * size)


WRONG["check_score_intensity"]["value_counted"] = lambda: (
    _intensity_value_counted,)
WRONG["check_weights_mib"]["integer_division"] = lambda: (
    lambda b, length, h, dtype: b * h * length ** 2 * (
        torch.finfo(dtype).bits // 8) // 2**20,)

# --- chapter 17: more planted mistakes (round 22) ---
# Exercise 17.1: document_id indexed by the row of the batch, as the page's
# (B, L) doc is; 17.2: the extra heads interleaved with the first ones in
# head order; 17.4: the score's scaling undone, or applied after the cap.


def _doc_window_batch_index(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        same = document_id[b, q_idx] == document_id[b, kv_idx]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def _slopes_interleaved(num_heads):
    p = 2 ** math.floor(math.log2(num_heads))
    first = slopes_power_of_two(p)
    extra = slopes_power_of_two(2 * p)[0::2][:num_heads - p]
    heads = []
    for h, slope in enumerate(first):
        heads += [slope] + extra[h:h + 1]
    return heads


WRONG["check_document_window_mod"]["batch_index"] = lambda: (
    _doc_window_batch_index,)
WRONG["check_alibi_slopes"]["interleaved"] = lambda: (_slopes_interleaved,)
WRONG["check_softcap_score_mod"]["scaled_again/unscaled"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: cap * torch.tanh(
        s * math.sqrt(8) / cap),)
WRONG["check_softcap_score_mod"]["scaled_again/after_cap"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: cap * torch.tanh(
        s / cap) / math.sqrt(8),)


# --- chapter 18: more planted mistakes (round 22) ---
# Exercise 18.2: the bytes per number, or the batch, left out.

WRONG["check_latent_cache_bytes"].update({
    "no_bytes": lambda: (lambda c, r, length, b, s: (c + r) * length * b,),
    "no_batch": lambda: (lambda c, r, length, b, s: (c + r) * length * s,),
})


def test_latent_cache_without_bytes_or_batch_is_named():
    for name, words in (("no_bytes", "bytes_per_number"),
                        ("no_batch", "batch")):
        verdict = _check("check_latent_cache_bytes",
                         WRONG["check_latent_cache_bytes"][name]())
        assert not verdict
        assert words in verdict.message


# --- chapter 14: more planted mistakes (round 22) ---
# Exercise 14.4: a cached attention step, fed a sequence chunk by chunk,
# against one causal pass.

def _step(q, k, v, pk, pv, mask="right", order="past_first"):
    both = ((torch.cat([pk, k], 2), torch.cat([pv, v], 2))
            if order == "past_first" else
            (torch.cat([k, pk], 2), torch.cat([v, pv], 2)))
    keys, values = both if mask != "new_only" else (k, v)
    if mask == "right":
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=causal_mask(q.size(2), keys.size(2)))
    elif mask in ("top_left", "new_only"):
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
    else:
        out = F.scaled_dot_product_attention(q, keys, values)
    return out, *both


def _step_by_hand(q, k_new, v_new, past_k, past_v):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    scores = q @ k.mT / q.size(-1) ** 0.5
    past = past_k.size(2)
    j = torch.arange(k.size(2))
    i = torch.arange(q.size(2))[:, None]
    scores = scores.masked_fill(j > past + i, float("-inf"))
    return scores.softmax(-1) @ v, k, v


RIGHT["check_cached_step"] = [lambda: (_step,), lambda: (_step_by_hand,)]
WRONG["check_cached_step"] = {
    "top_left": lambda: (lambda *a: _step(*a, mask="top_left"),),
    "no_mask": lambda: (lambda *a: _step(*a, mask="none"),),
    "new_only": lambda: (lambda *a: _step(*a, mask="new_only"),),
    "new_first": lambda: (lambda *a: _step(*a, order="new_first"),),
}

# --- chapter 1: more planted mistakes (round 24) ---
# itos (id -> token) passed to check_vocab instead of stoi is named as
# such, with and without "<pad>".
WRONG["check_vocab"]["itos"] = lambda: ({
    i: w for w, i in build_vocab(SENTENCES, specials=("<pad>",)).items()},)


def test_itos_for_stoi_is_named():
    for specials in ((), ("<pad>",)):
        itos = {i: w for w, i in
                build_vocab(SENTENCES, specials=specials).items()}
        verdict = _check("check_vocab", (itos,))
        assert not verdict
        assert CATALOGUE["check_vocab"]["itos"].message in verdict.message

# --- chapter 13: more planted mistakes (round 24) ---
# Exercise 13.1: the limit 2 * head_dim / bytes for the exact intensity
# (the reads of Q and K left out); Exercise 13.2: elements, not bytes (the
# first case has 2 heads, so this is not one head's weights in float32).
WRONG["check_score_intensity"]["asymptote"] = lambda: (
    lambda b, length, d, h, dtype: 2 * (d // h) / (
        torch.finfo(dtype).bits // 8),)
WRONG["check_weights_mib"]["elements"] = lambda: (
    lambda b, length, h, dtype: b * h * length ** 2 / 2**20,)


def test_weights_mib_tells_elements_from_one_head():
    hints = CATALOGUE["check_weights_mib"]
    for name, other in (("elements", "one_head"), ("one_head", "elements")):
        verdict = _check("check_weights_mib",
                         WRONG["check_weights_mib"][name]())
        assert hints[name].message in verdict.message
        assert hints[other].message not in verdict.message


# --- chapter 14: more planted mistakes (round 24) ---
# Exercise 14.4: returning only the new keys and values (not the whole
# cache) is named; a single new token is called "the token at position
# t", not "the chunk of positions t to t".

def _step_new_returned(q, k, v, pk, pv):
    out, _, _ = _step(q, k, v, pk, pv)
    return out, k, v


WRONG["check_cached_step"]["returned_new"] = lambda: (_step_new_returned,)


def test_cached_step_names_returning_only_the_new_keys():
    verdict = _check("check_cached_step",
                     WRONG["check_cached_step"]["returned_new"]())
    assert not verdict.ok
    assert "past ones with the new ones appended" in verdict.message


def test_cached_step_names_a_single_token_by_its_position():
    verdict = _check("check_cached_step",
                     WRONG["check_cached_step"]["top_left"]())
    assert "the token at position 3, 3 cached" in verdict.message
    assert "3 to 3" not in verdict.message

# --- chapter 17: more planted mistakes (round 24) ---
# Exercise 17.1: a window hard-coded instead of the argument, and a
# closure over the page's doc[0] instead of the document_id given.

_PAGE_DOC = torch.tensor([0] * 5 + [1] * 3 + [2] * 4)


def _doc_window_fixed(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        same = document_id[q_idx] == document_id[kv_idx]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < 4)
    return mask_mod


def _doc_window_other_tensor(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        same = _PAGE_DOC[q_idx] == _PAGE_DOC[kv_idx]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


WRONG["check_document_window_mod"]["fixed_window"] = lambda: (
    _doc_window_fixed,)
WRONG["check_document_window_mod"]["other_tensor"] = lambda: (
    _doc_window_other_tensor,)


# --- chapter 1: more planted mistakes (round 26) ---
# Exercise 1.1: the commas deleted, but not tokenize's ! . ?, with
# split() or split(" "); the generic hint counts tokens from 1.
WRONG["check_tokenizer"].update({
    "marks_kept": lambda: (lambda t: t.replace(",", "").lower().split(),),
    "marks_kept/split_space": lambda: (
        lambda t: t.replace(",", "").lower().split(" "),),
})


def test_tokenizer_generic_hint_counts_from_one_and_quotes_the_token():
    verdict = _check("check_tokenizer", (lambda t: [
        "nexxt" if w == "next" else w
        for w in tokenize(t.replace(",", ""))],))
    assert not verdict
    assert "token 6 (counting from 1): 'nexxt' instead of 'next'" in (
        verdict.message)


# --- chapter 7: more planted mistakes (round 26) ---
# The inverted masks of 7.2 and 7.3 point, as 7.1's does, to the first
# section that builds a mask, True on the visible keys (round 28: no
# longer to the chapter's title); the -1e9 hint names only the finite fill.

@pytest.mark.parametrize("checker", ["check_decoder_mask",
                                     "check_safe_softmax",
                                     "check_prefix_lm_mask"])
def test_chapter07_inverted_mask_points_to_the_convention(checker):
    verdict = _check(checker, WRONG[checker]["inverted"]())
    assert not verdict
    assert "'Padding masks from lengths' in chapter 7" in plain(
        verdict.message).replace("\n  ", " "), verdict.message


def test_chapter07_minus_1e9_hint_names_the_finite_fill_only():
    verdict = _check("check_safe_softmax",
                     WRONG["check_safe_softmax"]["finite_fill"]())
    assert not verdict
    assert "-1e9" in verdict.message, verdict.message
    assert "nan_to_num" not in verdict.message, verdict.message


# --- chapter 17: more planted mistakes (round 26) ---
# Exercise 17.2: the nearest larger power of two's slopes, cut to H
# heads; 17.4: Gemma 2's cap of 50 hard-coded instead of the argument.

WRONG["check_alibi_slopes"]["larger"] = lambda: (
    lambda n: [2.0 ** (-8 * (h + 1) / 2 ** math.ceil(math.log2(n)))
               for h in range(n)],)
WRONG["check_softcap_score_mod"]["fixed_cap"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: 50 * torch.tanh(s / 50),)


def test_softcap_success_names_the_caps_tried():
    verdict = _check("check_softcap_score_mod", RIGHT[
        "check_softcap_score_mod"][0]())
    assert "2 and 5" in verdict.message
    assert "cap = 50" not in verdict.message

# --- chapter 18: more planted mistakes (round 26) ---
# Exercise 18.3: both weights transposed, in the wrong order, is named.
# Exercise 18.2: a stray factor 4 is refused without calling it a
# multi-head cache (the first case's 2 x d_model is no multiple of C + R).
WRONG["check_key_projection"]["both_transposed"] = lambda: (
    lambda m: m.k_up.weight.T @ m.kv_down.weight.T,)


def test_chapter18_round26_stray_factor_is_not_called_multi_head():
    verdict = _check("check_latent_cache_bytes", (
        lambda c, r, length, b, s: 4 * (c + r) * length * b * s,))
    assert not verdict
    assert "multi-head" not in verdict.message

# --- chapter 12: more planted mistakes (round 26) ---
# Exercise 12.1: the FFN counted as one d_model x d_ff matrix, as one
# layer (its bias d_ff) or with both biases.
WRONG["check_block_params"].update({
    "one_ffn_matrix": lambda: (
        lambda d, f: block_params(d, f) - d * f - d,),
    "one_ffn_matrix/both_biases": lambda: (
        lambda d, f: block_params(d, f) - d * f,),
})


# --- chapter 14: more planted mistakes (round 26) ---
# Exercise 14.3: tril one diagonal too far. Exercise 14.4: the scores
# left unscaled, and the bool mask inverted (SDPA's zeros on a row with
# no key, or masked_fill's NaN).
WRONG["check_chunk_mask"]["one_ahead"] = lambda: (
    lambda q, p: torch.ones(q, p + q, dtype=torch.bool).tril(p + 1),)


def _step14(q, k_new, v_new, past_k, past_v, how):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    mask = causal_mask(q.size(2), k.size(2))
    if how == "unscaled":
        w = (q @ k.mT).masked_fill(~mask, float("-inf"))
        return w.softmax(-1) @ v, k, v
    if how == "inverted_fill":
        w = (q @ k.mT / q.size(-1) ** 0.5).masked_fill(mask, float("-inf"))
        return w.softmax(-1) @ v, k, v
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)
    return out, k, v


WRONG["check_cached_step"]["unscaled"] = lambda: (
    lambda *a: _step14(*a, "unscaled"),)
WRONG["check_cached_step"]["inverted"] = lambda: (
    lambda *a: _step14(*a, "inverted"),)
WRONG["check_cached_step"]["inverted/fill"] = lambda: (
    lambda *a: _step14(*a, "inverted_fill"),)

# --- chapter 13: more planted mistakes (round 26) ---
# Exercise 13.1: Q and K read for one head only (2 B L head_dim numbers),
# while the FLOPs and S count every head.


def _intensity_reads_one_head(b, length, d, h, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    flops = 2 * b * h * length ** 2 * (d // h)
    return flops / ((2 * b * length * (d // h) + b * h * length ** 2)
                    * size)


WRONG["check_score_intensity"]["reads_one_head"] = lambda: (
    _intensity_reads_one_head,)


# --- chapter 18: more planted mistakes (round 28) ---
# Exercise 18.4: the decoupled scores in the absorbed form. Planted: the
# latent part rotated, the rotary part not rotated or left out, the scale
# over D, over C + R or none, each head's W_uk block transposed.


def _scores18(m, x, mistake=None):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)  # (B, H, L, D)
    q_r = split_heads(m.q_rope_proj(x), heads)  # (B, H, L, R)
    k_r = m.k_rope_proj(x)  # (B, L, R)
    if mistake != "not_rotated":
        q_r, k_r = apply_rotary(q_r, pos), apply_rotary(k_r, pos)
    c = m.kv_down(x)  # (B, L, C)
    w = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    latent_q = q @ (w.mT if mistake == "transposed" else w)
    if mistake == "latent_rotated":
        latent_q, c = apply_rotary(latent_q, pos), apply_rotary(c, pos)
    s = latent_q @ c[:, None].mT
    if mistake != "no_rope":
        s = s + q_r @ k_r[:, None].mT
    width = {"scale_d": m.head_dim, "unscaled": 1,
             "scale_latent": m.kv_latent_dim + m.rope_dim}.get(
                 mistake, m.head_dim + m.rope_dim)
    return s / math.sqrt(width)


def _scores18_einsum(m, x):
    heads, d, r = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(x.size(1))
    q = m.q_proj(x).unflatten(-1, (heads, d))  # (B, L, H, D)
    q_r = apply_rotary(
        m.q_rope_proj(x).unflatten(-1, (heads, r)).transpose(1, 2), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R)
    w = m.k_up.weight.view(heads, d, -1)  # (H, D, C)
    latent_q = torch.einsum("blhd,hdc->bhlc", q, w)  # absorbed
    s = (torch.einsum("bhlc,bmc->bhlm", latent_q, m.kv_down(x))
         + torch.einsum("bhlr,bmr->bhlm", q_r, k_r))
    return s / (d + r) ** 0.5


RIGHT["check_absorbed_scores"] = [lambda: (_scores18,),
                                  lambda: (_scores18_einsum,)]
WRONG["check_absorbed_scores"] = {
    name: (lambda name=name: (
        lambda m, x: _scores18(m, x, name),))
    for name in ("latent_rotated", "not_rotated", "no_rope", "scale_d",
                 "scale_latent", "unscaled", "transposed")}


def test_chapter18_round28_scores_off_by_a_constant_are_refused():
    verdict = _check("check_absorbed_scores", (
        lambda m, x: _scores18(m, x) + 1,))
    assert not verdict and "Correct" not in verdict.message
# Exercise 18.2: the cache multiplied by the number of heads (4 in the
# checker's first case) is named.
WRONG["check_latent_cache_bytes"]["times_heads"] = lambda: (
    lambda c, r, length, b, s: 4 * (c + r) * length * b * s,)

# --- chapter 12: more planted mistakes (round 28) ---
# Exercise 12.4: Llama's block (no biases, SwiGLU's three matrices, two
# RMSNorms with a gain only), counted by formula or from modules.


def _llama_params(d, f):  # the book's answer
    return 4 * d * d + 3 * d * f + 2 * d


def _llama_modules(d, f):
    with torch.random.fork_rng():
        parts = [nn.Linear(d, d, bias=False) for _ in range(4)]
        parts += [nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False),
                  nn.Linear(d, f, bias=False), nn.RMSNorm(d), nn.RMSNorm(d)]
    return sum(p.numel() for m in parts for p in m.parameters())


RIGHT["check_llama_block_params"] = [
    lambda: (_llama_params,), lambda: (_llama_modules,)]
WRONG["check_llama_block_params"] = {
    "no_gate": lambda: (lambda d, f: _llama_params(d, f) - d * f,),
    "four_d_model": lambda: (lambda d, f: _llama_params(d, 4 * d),),
    "four_d_model/two_matrices": lambda: (
        lambda d, f: 4 * d * d + 2 * d * 4 * d + 2 * d,),
    "attention_biases": lambda: (
        lambda d, f: _llama_params(d, f) + 4 * d,),
    "ffn_biases": lambda: (
        lambda d, f: _llama_params(d, f) + 2 * f + d,),
    "all_biases": lambda: (
        lambda d, f: _llama_params(d, f) + 4 * d + 2 * f + d,),
    "norm_betas": lambda: (lambda d, f: _llama_params(d, f) + 2 * d,),
    "no_norms": lambda: (lambda d, f: 4 * d * d + 3 * d * f,),
    "transformer_block": lambda: (lambda d, f: block_params(d, f),),
}

# Exercise 12.2: Gemma's output norm without its input norm,
# x + norm1(attn(x)), then h + norm2(ffn(h)).


def _output_norm(block, x):
    h = x + block.norm1(block.attn(x, need_weights=False)[0])
    hidden = block.activation(block.linear1(h))
    return h + block.norm2(block.linear2(hidden))


WRONG["check_pre_norm"]["output_norm"] = lambda: (_output_norm,)

# --- chapter 7: more planted mistakes (round 28) ---
# Exercise 7.3: NaN hidden everywhere (nan_to_num(0.0), or w != w zeroed)
# passes the empty rows but also hides a NaN score from upstream.
# Exercise 7.4 (new): a prefix-LM mask, with its classic mistakes.


def _hide_every_nan(s, m):
    w = torch.softmax(s.float().masked_fill(~m, INF), dim=-1)
    return w.nan_to_num(0.0).to(s.dtype)


def _zero_where_nan(s, m):
    w = torch.softmax(s.float().masked_fill(~m, INF), dim=-1)
    return torch.where(w != w, 0.0, w).to(s.dtype)


WRONG["check_safe_softmax"].update({
    "hides_nan": lambda: (_hide_every_nan,),
    "hides_nan/where": lambda: (_zero_where_nan,),
})


def _finfo_min_then_zeroed(s, m):  # the solution's accepted variant
    x = s.float().masked_fill(~m, torch.finfo(torch.float32).min)
    empty = ~m.any(dim=-1, keepdim=True)
    return torch.softmax(x, dim=-1).masked_fill(empty, 0.0).to(s.dtype)


RIGHT["check_safe_softmax"].append(lambda: (_finfo_min_then_zeroed,))


def _prefix_lm(how):
    def fn(p, n):
        length = int(n.max())
        pos = torch.arange(length)
        real = (pos < n[:, None])[:, None, None, :]  # (B, 1, 1, L)
        past = pos[None, :] <= pos[:, None]  # (L, L)
        pre = (pos < p[:, None])[:, None, None, :]
        wide = (pos <= p[:, None])[:, None, None, :]
        rows = (pos < p[:, None])[:, None, :, None]
        tril = torch.ones(length, length, dtype=torch.bool).tril()
        return {
            "right": real & (past | pre),
            "right/tril": real & (tril | pre),
            "causal_only": real & tril,
            "no_causal": real.expand(-1, 1, length, -1),
            "prefix_on_queries": real & (past | rows),
            "and_for_or": real & past & pre,
            "one_too_many": real & (past | wide),
            "no_padding": (past | pre).expand(len(n), 1, -1, -1),
            "pad_queries": real.mT & (past | pre),
            "pad_queries/both": real & real.mT & (past | pre),
            "inverted": ~(real & (past | pre)),
            "no_head_axis": (real & (past | pre))[:, 0],
        }[how]
    return fn


RIGHT["check_prefix_lm_mask"] = [
    lambda: (_prefix_lm("right"),), lambda: (_prefix_lm("right/tril"),)]
WRONG["check_prefix_lm_mask"] = {
    name: (lambda name=name: (_prefix_lm(name),))
    for name in ("causal_only", "no_causal", "prefix_on_queries",
                 "and_for_or", "one_too_many", "no_padding", "pad_queries",
                 "pad_queries/both", "inverted", "no_head_axis")}


def test_chapter7_hidden_nan_and_prefix_hints_point_at_real_places():
    hint = CATALOGUE["check_safe_softmax"]["hides_nan"]
    assert "nan_to_num" in hint.hint
    assert CATALOGUE["check_decoder_mask"]["no_head_axis"].section == (
        "Causal masks")
    for checker in ("check_decoder_mask", "check_safe_softmax"):
        assert CATALOGUE[checker]["inverted"].section != "Masking"

# --- chapter 17: more planted mistakes (round 30) ---
# Exercise 17.1: the window's distance written the wrong way round,
# kv_idx - q_idx < window, removes no key under the causal part: the
# hint names the reversed sign, not only a missing window.
WRONG["check_document_window_mod"]["no_window/reversed"] = lambda: (
    lambda d, w: lambda b, h, q, kv: (
        (d[q] == d[kv]) & (q >= kv) & (kv - q < w)),)


def test_chapter17_round30_reversed_window_gets_its_hint():
    test_the_planted_mistake_is_refused_with_its_hint(
        "check_document_window_mod", "no_window/reversed")
    verdict = _check("check_document_window_mod", WRONG[
        "check_document_window_mod"]["no_window/reversed"]())
    assert "wrong way round" in verdict.message, verdict.message


# --- chapter 14: more planted mistakes (round 30) ---
# Exercise 14.4: the cached and new keys concatenated on the head axis
# (dim 1) or on the last axis raise; the hint names the position axis.

def _step_cat_on(dim):
    def step(q, k_new, v_new, past_k, past_v):
        k = torch.cat([past_k, k_new], dim=dim)
        v = torch.cat([past_v, v_new], dim=dim)
        mask = causal_mask(q.size(2), k.size(2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out, k, v
    return step


WRONG["check_cached_step"]["cat_axis"] = lambda: (_step_cat_on(1),)
WRONG["check_cached_step"]["cat_axis/last"] = lambda: (_step_cat_on(-1),)


def test_cached_step_names_the_wrong_concatenation_axis():
    for name in ("cat_axis", "cat_axis/last"):
        verdict = _check("check_cached_step",
                         WRONG["check_cached_step"][name]())
        assert not verdict.ok
        assert CATALOGUE["check_cached_step"]["cat_axis"].message in (
            verdict.message)
    right = _check("check_cached_step", (_step_cat_on(2),))
    assert right.ok


# --- chapter 1: more planted mistakes (round 30) ---
# an extra "<unk>" in the vocabulary: the hint names only what is extra.
def test_vocab_hint_names_only_what_is_wrong():
    extra_unk = build_vocab(SENTENCES, specials=("<pad>", "<unk>"))
    verdict = _check("check_vocab", (extra_unk,))
    assert not verdict
    assert "extra ['<unk>']" in verdict.message
    assert "missing" not in verdict.message
# the split of "bugs" with the three merges (check_bpe_split): "bug" as a
# piece, no end-of-word marker, "s</w>" joined, no merge applied.
RIGHT["check_bpe_split"] = [lambda: (["b", "ug", "s", "</w>"],),
                            lambda: (("b", "ug", "s", "</w>"),)]
WRONG["check_bpe_split"] = {
    "whole_word": lambda: (["bug", "s", "</w>"],),
    "whole_word/no_marker": lambda: (["bug", "s"],),
    "no_end_marker": lambda: (["b", "ug", "s"],),
    "marker_joined": lambda: (["b", "ug", "s</w>"],),
    "unmerged": lambda: (["b", "u", "g", "s", "</w>"],),
}


def test_bugs_split_refuses_junk_and_other_splits():
    assert not _check("check_bpe_split", ("b ug s </w>",))
    assert not _check("check_bpe_split", (None,))
    verdict = _check("check_bpe_split", (["bu", "g", "s", "</w>"],))
    assert not verdict and "b u g s </w>" in verdict.message

# --- chapter 18: more planted mistakes (round 30) ---
# Exercise 18.4: the rotary query rotated but not the shared key; the
# scores returned masked, or their softmax; the content and rotary parts
# scaled by 1/sqrt(D) and 1/sqrt(R) apart. Exercise 18.2: the cache in
# GiB (or GB). Exercise 18.1: q @ w_uk.T, the whole transpose.


def _scores18_r30(m, x, mistake):
    heads, d, r = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(x.size(1))
    q = mha_lib.split_heads(m.q_proj(x), heads)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    k_r = m.k_rope_proj(x)
    if mistake != "key_not_rotated":
        k_r = apply_rotary(k_r, pos)
    latent_q = q @ m.k_up.weight.unflatten(0, (heads, -1))
    content = latent_q @ m.kv_down(x)[:, None].mT
    rotary = q_r @ k_r[:, None].mT
    if mistake == "split_scale":
        return content / d ** 0.5 + rotary / r ** 0.5
    s = (content + rotary) / (d + r) ** 0.5
    if mistake == "key_not_rotated":
        return s
    s = s.masked_fill(~causal_mask(x.size(1)), float("-inf"))
    return s if mistake == "masked" else s.softmax(-1)


WRONG["check_absorbed_scores"].update({
    name: (lambda name=name: (lambda m, x: _scores18_r30(m, x, name),))
    for name in ("key_not_rotated", "masked", "softmax", "split_scale")})
WRONG["check_latent_cache_bytes"].update({
    "gib": lambda: (
        lambda c, r, length, b, s: (c + r) * length * b * s / 2**30,),
    "gib/gb": lambda: (
        lambda c, r, length, b, s: (c + r) * length * b * s / 1e9,),
})
WRONG["check_absorbed_query"]["whole_transposed"] = lambda: (
    lambda q, w, h: q @ w.T,)


def test_chapter18_round30_softmax_without_mask_is_named():
    verdict = _check("check_absorbed_scores", (
        lambda m, x: _scores18(m, x).softmax(-1),))
    assert not verdict
    assert CATALOGUE["check_absorbed_scores"]["softmax"].message \
        in verdict.message

# --- chapter 7: more planted mistakes (round 30) ---
# Exercise 7.1: `lengths - 1` (one key too few) and a missing [:, None]
# (the broadcasting RuntimeError becomes a hint); 7.2: the whole mask
# transposed; 7.3: the caller's scores filled in place (masked_fill_).
WRONG["check_padding_mask"].update({
    "one_too_few": lambda: (
        lambda n, m: (torch.arange(m) < (n - 1)[:, None])[:, None, None],),
    "no_lengths_axis": lambda: (
        lambda n, m: (torch.arange(m) < n)[:, None, None],),
})
WRONG["check_decoder_mask"]["transposed"] = lambda: (
    lambda n: (mha_lib.padding_mask(n)
               & mha_lib.causal_mask(int(n.max()))).mT,)
WRONG["check_safe_softmax"]["in_place"] = lambda: (
    lambda s, m: masked_softmax(s.masked_fill_(~m, INF), m),)


def test_chapter07_missing_axis_names_the_broadcast():
    verdict = _check("check_padding_mask",
                     WRONG["check_padding_mask"]["no_lengths_axis"]())
    assert "RuntimeError" in verdict.message
    assert "lengths[:, None]" in verdict.message

# --- chapter 12: more planted mistakes (round 30) ---
# Exercise 12.1: TransformerBlock's own signature, the textbook 12 d^2, one
# bias vector forgotten. Exercise 12.4: one RMSNorm, the final norm per
# block. check_pre_norm: a hard-coded GELU, LayerNorm without the block's
# gamma and beta, an in-place x +=. Exercise 12.2 (new): Llama's block
# forward from its parts, with its classic mistakes.

WRONG["check_block_params"].update({
    "num_heads_argument": lambda: (lambda d, h, f: block_params(d, f),),
    "twelve_d_squared": lambda: (lambda d, f: 12 * d * d,),
    "one_bias": lambda: (lambda d, f: block_params(d, f) - d,),
})
WRONG["check_llama_block_params"].update({
    "one_rms_norm": lambda: (lambda d, f: _llama_params(d, f) - d,),
    "final_norm": lambda: (lambda d, f: _llama_params(d, f) + d,),
})


def _pre_norm_parts(block, x, act=None, norm=None, in_place=False):
    n1, n2 = (norm, norm) if norm else (block.norm1, block.norm2)
    a = block.attn(n1(x), need_weights=False)[0]
    if in_place:
        x += a
    else:
        x = x + a
    hidden = (act or block.activation)(block.linear1(n2(x)))
    return x + block.linear2(hidden)


def _fresh(h):
    return F.layer_norm(h, h.shape[-1:])


WRONG["check_pre_norm"].update({
    "fixed_gelu": lambda: (lambda b, x: _pre_norm_parts(b, x, act=F.gelu),),
    "fresh_norm": lambda: (lambda b, x: _pre_norm_parts(b, x, norm=_fresh),),
    "fresh_norm/module": lambda: (lambda b, x: _pre_norm_parts(
        b, x, norm=nn.LayerNorm(x.size(-1))),),
    "in_place": lambda: (
        lambda b, x: _pre_norm_parts(b, x, in_place=True),),
    "stale_ffn_input/neox": lambda: (lambda b, x: x + b.attn(
        b.norm1(x))[0] + b.linear2(b.activation(b.linear1(b.norm2(x)))),),
})


def _rms(x, gamma, eps=1e-6):  # the page's rms_norm
    return gamma * x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)


def _llama(p, x, how="right"):
    def n1(h):
        if how == "layer_norm":
            return F.layer_norm(h, h.shape[-1:], p.norm1.weight, eps=1e-6)
        return _rms(h, 1.0 if how == "no_gain" else p.norm1.weight)

    def n2(h):
        if how == "layer_norm":
            return F.layer_norm(h, h.shape[-1:], p.norm2.weight, eps=1e-6)
        return _rms(h, 1.0 if how == "no_gain" else p.norm2.weight)

    def attn(h):
        return p.attn(h, need_weights=False,
                      is_causal=how == "causal_mask")[0]

    def swiglu(z):
        a, g = p.w1(z), p.w3(z)
        if how == "gate_swapped":
            return p.w2(F.silu(g) * a)
        if how == "no_gate":
            return p.w2(F.silu(a))
        if how == "no_silu":
            return p.w2(a * g)
        return p.w2((F.gelu if how == "gelu" else F.silu)(a) * g)

    if how == "post_norm":
        h = n1(x + attn(x))
        return n2(h + swiglu(h))
    if how == "normalised_stream":
        x = n1(x)
        h = x + attn(x)
        h = n2(h)
        return h + swiglu(h)
    if how == "swapped_order":
        h = x + swiglu(n1(x))
        return h + attn(n2(h))
    if how == "parallel":
        return x + attn(n1(x)) + swiglu(n1(x))
    if how == "stale_ffn_input":  # a parallel block, two norms (GPT-NeoX)
        return x + attn(n1(x)) + swiglu(n2(x))
    if how == "pair_sum":
        h = x + p.attn(n1(x))
        return h + swiglu(n2(h))
    if how == "in_place":
        x += attn(n1(x))
        return x + swiglu(n2(x))
    h = attn(n1(x)) if how == "no_first_residual" else x + attn(n1(x))
    if how == "no_second_residual":
        return swiglu(n2(h))
    if how == "one_norm":
        return h + swiglu(n1(h))
    return h + swiglu(n2(h))


def _llama_modules_forward(p, x):
    h = x + p.attn(p.norm1(x), p.norm1(x), p.norm1(x))[0]
    z = p.norm2(h)
    return h + p.w2(F.silu(p.w1(z)) * p.w3(z))


RIGHT["check_llama_block"] = [lambda: (_llama,),
                              lambda: (_llama_modules_forward,)]
WRONG["check_llama_block"] = {
    name: (lambda name=name: (lambda p, x: _llama(p, x, name),))
    for name in ("post_norm", "normalised_stream", "one_norm",
                 "stale_ffn_input", "parallel", "no_first_residual",
                 "no_second_residual", "swapped_order", "layer_norm",
                 "no_gain", "gate_swapped", "no_gate", "no_silu", "gelu",
                 "causal_mask", "pair_sum", "in_place")}


def test_chapter12_round30_success_message_reads_the_updated_stream():
    verdict = _check("check_pre_norm", RIGHT["check_pre_norm"][0]())
    assert "norm2(h)" in verdict.message and "norm2(x)" not in verdict.message

# --- chapter 1: more planted mistakes (round 32) ---
# Exercise 1.3: a pair written the wrong way round, ("g", "u") for the ug
# of bug, is named as such, not as a pair an earlier merge removed.
WRONG["check_bpe_merges"].update({
    "reversed_pair": lambda: ([("g", "u"), ("ug", "</w>"), ("b", "ug</w>")],),
    "reversed_pair/third": lambda: (
        [("u", "g"), ("ug", "</w>"), ("ug</w>", "b")],),
})


def test_reversed_first_pair_is_not_called_stale():
    verdict = _check("check_bpe_merges",
                     ([("g", "u"), ("ug", "</w>"), ("b", "ug</w>")],))
    message = " ".join(verdict.message.split())
    assert not verdict.ok
    assert "merges[0] = ('g', 'u')" in message
    assert "wrong way round" in message and "no longer" not in message

# --- chapter 18: more planted mistakes (round 32) ---
# Exercise 18.4: the scale over sqrt(C), the latent's width (the first
# module has D = C, where it is also sqrt(D): a later one names it); the
# rotary key rotated but not the rotary queries.


def _scores18_r32(m, x, mistake):
    heads, d, r = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(x.size(1))
    q = mha_lib.split_heads(m.q_proj(x), heads)
    q_r = mha_lib.split_heads(m.q_rope_proj(x), heads)
    if mistake != "query_not_rotated":
        q_r = apply_rotary(q_r, pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)
    latent_q = q @ m.k_up.weight.unflatten(0, (heads, -1))
    s = latent_q @ m.kv_down(x)[:, None].mT + q_r @ k_r[:, None].mT
    width = m.kv_latent_dim if mistake == "scale_c" else d + r
    return s / width ** 0.5


WRONG["check_absorbed_scores"].update({
    name: (lambda name=name: (lambda m, x: _scores18_r32(m, x, name),))
    for name in ("scale_c", "query_not_rotated")})


def test_chapter18_round32_scale_over_d_is_still_named_d():
    verdict = _check("check_absorbed_scores", (
        lambda m, x: _scores18(m, x, "scale_d"),))
    assert CATALOGUE["check_absorbed_scores"]["scale_d"].message \
        in verdict.message
# Exercise 18.1: the heads summed by one einsum, then broadcast back to
# (B, H, L, C), is named as the heads merged.
WRONG["check_absorbed_query"]["heads_merged/broadcast"] = lambda: (
    lambda q, w, h: torch.einsum("bhld,hdc->blc", q, w.unflatten(
        0, (h, -1)))[:, None].expand(-1, h, -1, -1),)

# --- chapter 12: more planted mistakes (round 32) ---
# The slip the chapter warns about in bold, the residual path normalised,
# norm(x) + f(norm(x)), in one sublayer only; a block norm once more on the
# block's output (GPT-2's ln_f belongs after the stack); Llama's SiLU
# written as the sigmoid alone.


def _pre_norm_slips(b, x, how):
    def ffn(h):
        return b.linear2(b.activation(b.linear1(h)))

    a = b.attn(b.norm1(x), need_weights=False)[0]
    h = (b.norm1(x) if how == "first" else x) + a
    if how == "second":
        return b.norm2(h) + ffn(b.norm2(h))
    out = h + ffn(b.norm2(h))
    return b.norm1(out) if how == "norm1" else out


def _llama_slips(p, x, how):
    def swiglu(z):
        act = torch.sigmoid if how == "alone" else F.silu
        return p.w2(act(p.w1(z)) * p.w3(z))

    a = p.attn(p.norm1(x), need_weights=False)[0]
    h = (p.norm1(x) if how == "first" else x) + a
    if how == "second":
        return p.norm2(h) + swiglu(p.norm2(h))
    out = h + swiglu(p.norm2(h))
    if how == "fresh":
        return F.rms_norm(out, out.shape[-1:])
    return {"norm1": p.norm1, "norm2": p.norm2}.get(how, nn.Identity())(out)


WRONG["check_pre_norm"].update({
    f"{mistake}/{how}": (lambda how=how: (
        lambda b, x: _pre_norm_slips(b, x, how),))
    for mistake, how in (("normalised_stream", "first"),
                         ("normalised_stream", "second"),
                         ("final_norm", "norm1"))})
WRONG["check_llama_block"].update({
    f"{mistake}/{how}": (lambda how=how: (
        lambda p, x: _llama_slips(p, x, how),))
    for mistake, how in (("normalised_stream", "first"),
                         ("normalised_stream", "second"),
                         ("final_norm", "fresh"), ("final_norm", "norm1"),
                         ("final_norm", "norm2"), ("sigmoid", "alone"))})

# --- chapter 7: more planted mistakes (round 32) ---
# Exercises 7.2 and 7.4 refuse the library's masks, as 7.1 does (a right
# mask built with them is named, a wrong one keeps its own hint); 7.2
# names LLMs-from-scratch's True = blocked triangle, triu(diagonal=1),
# used as "may attend"; 7.3 tells a hand-written exp times the mask,
# whose hidden score overflows (inf * 0 = NaN), from the underflow of
# masking after the softmax; 7.4 names one prompt key too few.


def _decoder_by_comparison(n):
    length = int(n.max())
    pos = torch.arange(length)
    return (pos < n[:, None])[:, None, None, :] & (pos <= pos[:, None])


def _exp_times_mask(scores, mask, over="visible"):
    """A hand-written softmax: exp(s - max) times the mask, normalised;
    the max over the visible keys (overflow) or over all (underflow)."""
    s = scores.float()
    if over == "visible":
        top = s.masked_fill(~mask, float("-inf")).amax(-1, keepdim=True)
    else:
        top = s.amax(-1, keepdim=True)
    e = torch.exp(s - top) * mask
    return (e / e.sum(-1, keepdim=True)).to(scores.dtype)


RIGHT["check_decoder_mask"][0] = lambda: (_decoder_by_comparison,)
WRONG["check_decoder_mask"].update({
    "library": lambda: (
        lambda n: padding_mask(n) & causal_mask(int(n.max())),),
    "blocked_triangle": lambda: (
        lambda n: padding_mask(n) & torch.ones(
            int(n.max()), int(n.max()), dtype=torch.bool).triu(1),),
})
WRONG["check_prefix_lm_mask"].update({
    "library": lambda: (lambda p, n: padding_mask(n) & (causal_mask(
        int(n.max())) | padding_mask(p, int(n.max()))),),
    "one_too_few": lambda: (lambda p, n: _prefix_lm("right")(
        (p - 1).clamp(min=0), n),),
})
WRONG["check_safe_softmax"].update({
    "exp_overflow": lambda: (_exp_times_mask,),
    "after_softmax/exp_underflow": lambda: (
        lambda s, m: _exp_times_mask(s, m, over="all"),),
})


def test_chapter07_round32_library_masks_refused_like_7_1():
    for checker in ("check_decoder_mask", "check_prefix_lm_mask"):
        verdict = _check(checker, WRONG[checker]["library"]())
        assert not verdict
        assert "without" in verdict.message, verdict.message
    # a wrong mask built with the library keeps its own hint
    test_the_planted_mistake_is_refused_with_its_hint(
        "check_decoder_mask", "either")


def test_chapter07_round32_overflow_is_not_called_underflow():
    verdict = _check("check_safe_softmax",
                     WRONG["check_safe_softmax"]["exp_overflow"]())
    assert "overflows" in verdict.message, verdict.message
    assert "underflow" not in verdict.message, verdict.message
    verdict = _check("check_safe_softmax", WRONG["check_safe_softmax"][
        "after_softmax/exp_underflow"]())
    assert "underflow" in verdict.message, verdict.message

# --- chapter 17: more planted mistakes (round 32) ---
# Exercise 17.5: what the ring of W slots holds after n tokens; the
# slot one on, W - 1 or W + 1 positions, the next token, position order,
# the first W never overwritten, another mark for an empty slot.

def _ring_held(n, window, first=None, stop=None, slots=None, shift=0,
               empty=None):
    slots = window if slots is None else slots
    first = n - window if first is None else first
    held = [-window if empty is None else empty] * slots
    for t in range(max(0, first), n if stop is None else stop):
        held[(t + shift) % slots] = t
    return held


def _ring_held_tensor(n, window):  # the latest t < n with t % W == slot
    slot = torch.arange(window)
    return torch.where(slot < n, n - 1 - (n - 1 - slot) % window, -window)


RIGHT["check_ring_held"] = [lambda: (_ring_held,),
                            lambda: (_ring_held_tensor,)]
WRONG["check_ring_held"] = {
    "next_slot": lambda: (lambda n, w: _ring_held(n, w, shift=1),),
    "one_too_few": lambda: (lambda n, w: _ring_held(n, w, n - w + 1),),
    "one_too_many": lambda: (
        lambda n, w: _ring_held(n, w, n - w - 1, slots=w + 1),),
    "next_token": lambda: (
        lambda n, w: _ring_held(n, w, n - w + 1, n + 1),),
    "in_order": lambda: (
        lambda n, w: sorted(t for t in _ring_held(n, w) if t >= 0)
        + [-w] * (w - min(n, w)),),
    "never_overwritten": lambda: (
        lambda n, w: _ring_held(n, w, 0, min(n, w)),),
    "empty": lambda: (lambda n, w: _ring_held(n, w, empty=-1),),
    "empty/zero": lambda: (lambda n, w: _ring_held(n, w, empty=0),),
    # round 50: a ring of W - 1 slots (the page says W - 1 would do);
    # None, not -W, in a slot never written
    "w_minus_one_slots": lambda: (
        lambda n, w: _ring_held(n, w, n - w + 1, slots=max(w - 1, 1)),),
    "empty_none": lambda: (
        lambda n, w: [None if t == -w else t for t in _ring_held(n, w)],),
}


def test_chapter17_round32_ring_held_wants_integers_per_slot():
    verdict = _check("check_ring_held", (lambda n, w: None,))
    assert not verdict and "integers, one per slot" in verdict.message

# --- chapter 14: more planted mistakes (round 32) ---
# Exercise 14.1: the 7B-like model's 32 query heads instead of
# num_kv_heads; exercise 14.4: keys and values returned swapped.

def _bytes_all_heads(num_layers, num_kv_heads, head_dim, length, batch,
                     bytes_per_number):
    return 2 * num_layers * 32 * head_dim * length * batch \
        * bytes_per_number


def _step_swapped(q, k, v, pk, pv):
    out, keys, values = _step(q, k, v, pk, pv)
    return out, values, keys


WRONG["check_cache_bytes"]["all_heads"] = lambda: (_bytes_all_heads,)
WRONG["check_cached_step"]["swapped"] = lambda: (_step_swapped,)


# Exercise 14.1, second half: how many sequences, and how long a context,
# fit beside the 7B-like model's weights on 80 GiB.

_PARAMS_7B = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) \
    + 2 * 32000 * 4096 + 4096


def _fits(total=80 * 2**30 - 2 * _PARAMS_7B, divide=lambda a, b: a // b):
    def fits(num_kv_heads):
        sequence = 2 * 32 * num_kv_heads * 128 * 4096 * 2
        position = 2 * 32 * num_kv_heads * 128 * 32 * 2
        return divide(total, sequence), divide(total, position)
    return fits


def _fits_int(num_kv_heads):
    free = 80 * 2**30 - 2 * _PARAMS_7B
    per_token = 4 * 32 * num_kv_heads * 128
    return int(free / per_token) // 4096, int(free / per_token) // 32


RIGHT["check_cache_capacity"] = [lambda: (_fits(),), lambda: (_fits_int,)]
WRONG["check_cache_capacity"] = {
    "no_weights": lambda: (_fits(total=80 * 2**30),),
    "gb": lambda: (_fits(total=80 * 10**9 - 2 * _PARAMS_7B),),
    "gb/no_weights": lambda: (_fits(total=80 * 10**9),),
    "rounded_up": lambda: (_fits(divide=lambda a, b: -(-a // b)),),
    "rounded_up/float": lambda: (_fits(divide=lambda a, b: a / b),),
}


# --- chapter 13: more planted mistakes (final review) ---
# Exercise 13.3: the running max started at 0 instead of -inf (right for
# every row with a positive score, NaN for rows of very negative scores).

def tiled_softmax_zero_start(scores, block_size):
    blocks = scores.split(block_size, dim=-1)
    m = torch.zeros_like(scores[..., :1])
    total = torch.zeros_like(m)
    for block in blocks:
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        total = (torch.exp(m - m_new) * total
                 + torch.exp(block - m_new).sum(dim=-1, keepdim=True))
        m = m_new
    return torch.cat([torch.exp(b - m) / total for b in blocks], dim=-1)


WRONG["check_tiled_softmax"]["zero_init"] = lambda: (tiled_softmax_zero_start,)


# --- chapter 13: more planted mistakes (final round) ---
# Exercise 13.1: the intensity truncated to a whole number, by int() of the
# right value or by // in place of / (0 for the running example's layer).

def _intensity_int(b, length, d, h, dtype):
    return int(_intensity(b, length, d, h, dtype))


def _intensity_floor_division(b, length, d, h, dtype):
    size = torch.finfo(dtype).bits // 8
    return (2 * b * h * length ** 2 * (d // h)
            // ((2 * b * length * d + b * h * length ** 2) * size))


WRONG["check_score_intensity"]["truncated"] = lambda: (_intensity_int,)
WRONG["check_score_intensity"]["truncated/floor_division"] = lambda: (
    _intensity_floor_division,)

# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.1, second half: the keys alone (the factor 2 for keys and
# values dropped); exercise 14.3: an all-True mask; exercise 14.4: the
# softmax over the queries' axis.

def _fits_keys_only(num_kv_heads):
    free = 80 * 2**30 - 2 * _PARAMS_7B
    per_token = 32 * num_kv_heads * 128 * 2
    return free // (per_token * 4096), free // (per_token * 32)


def _step_softmax_axis(q, k_new, v_new, past_k, past_v):
    out, k, v = _step_by_hand(q, k_new, v_new, past_k, past_v)
    scores = q @ k.mT / q.size(-1) ** 0.5
    j = torch.arange(k.size(2))
    i = torch.arange(q.size(2))[:, None]
    scores = scores.masked_fill(j > past_k.size(2) + i, float("-inf"))
    return scores.softmax(-2) @ v, k, v


WRONG["check_cache_capacity"]["keys_only"] = lambda: (_fits_keys_only,)


def _fits_one_layer(num_kv_heads):  # the bytes of one layer's cache
    free = 80 * 2**30 - 2 * _PARAMS_7B
    per_token = 2 * num_kv_heads * 128 * 2
    return free // (per_token * 4096), free // (per_token * 32)


WRONG["check_cache_capacity"]["one_layer"] = lambda: (_fits_one_layer,)
WRONG["check_chunk_mask"]["all_ones"] = lambda: (
    lambda q, p: torch.ones(q, p + q, dtype=torch.bool),)
WRONG["check_cached_step"]["softmax_axis"] = lambda: (_step_softmax_axis,)


# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.1: the comma kept as a token of its own (LLMs-from-scratch's
# style) is named as such, not as a comma glued to its word. Exercise
# 1.2: pad counts given as the lengths, and a transposed batch.
WRONG["check_tokenizer"]["comma_token"] = lambda: (
    lambda t: mha_lib.tokenize(t.replace(",", " ,")),)
WRONG["check_padded_batch"].update({
    "pad_counts": lambda: ([[12, 13, 3, 8], [1, 2, 10, 0]], [0, 1]),
    "transposed": lambda: (torch.tensor([[12, 13, 3, 8],
                                         [1, 2, 10, 0]]).T, [4, 3]),
    "transposed/lists": lambda: ([[12, 1], [13, 2], [3, 10], [8, 0]],
                                 [4, 3]),
})

# --- chapter 18: more planted mistakes (final round) ---
# Exercise 18.4: the explicit form (every head's keys rebuilt with k_up),
# right in value, is refused: the exercise asks for no key rebuilt.


def _scores18_explicit(m, x):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = mha_lib.split_heads(m.q_proj(x), heads)
    k = mha_lib.split_heads(m.k_up(m.kv_down(x)), heads)  # rebuilt
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)[:, None]
    s = q @ k.mT + q_r @ k_r.mT
    return s / (m.head_dim + m.rope_dim) ** 0.5


WRONG["check_absorbed_scores"]["rebuilt_keys"] = lambda: (
    _scores18_explicit,)

# --- chapter 17: more planted mistakes (final round) ---
# Exercise 17.1: a strict causal part, q_idx > kv_idx, hides the query
# from itself; exercise 17.5: the ring's slots sorted (sorted(held)),
# empty slots first, is the position-order mistake.
WRONG["check_document_window_mod"]["strict"] = lambda: (
    lambda d, w: lambda b, h, q, kv: (
        (d[q] == d[kv]) & (q > kv) & (q - kv < w)),)
WRONG["check_ring_held"]["in_order/sorted"] = lambda: (
    lambda n, w: sorted(_ring_held(n, w)),)


def test_chapter17_final_strict_causal_and_sorted_ring_are_named():
    verdict = _check("check_document_window_mod", WRONG[
        "check_document_window_mod"]["strict"]())
    assert "must see itself" in verdict.message, verdict.message
    verdict = _check("check_ring_held",
                     WRONG["check_ring_held"]["in_order/sorted"]())
    assert "sorted?" in verdict.message, verdict.message

# --- chapter 12: more planted mistakes (final round) ---
# Exercise 12.2: ReLU in place of SiLU in SwiGLU (ReGLU) gets its own hint.

def _llama_relu(p, x):
    h = x + p.attn(p.norm1(x), need_weights=False)[0]
    z = p.norm2(h)
    return h + p.w2(F.relu(p.w1(z)) * p.w3(z))


WRONG["check_llama_block"]["relu"] = lambda: (_llama_relu,)

# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.2: the padded batch written as tokens, not ids (with or
# without a "<pad>" token), and a vocabulary with an extra "<unk>".
WRONG["check_padded_batch"].update({
    "tokens": lambda: ([["what", "will", "come", "next"],
                        ["a", "basic", "split", "<pad>"]], [4, 3]),
    "tokens/ragged": lambda: ([["what", "will", "come", "next"],
                               ["a", "basic", "split"]], [4, 3]),
})
WRONG["check_vocab"]["extra_special"] = lambda: (
    build_vocab(SENTENCES, specials=("<pad>", "<unk>")),)


# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.1, second half: the weights counted in float32 (4 bytes a
# parameter), and the two answers returned in swapped order.

def _fits_swapped(num_kv_heads):
    return tuple(reversed(_fits()(num_kv_heads)))


WRONG["check_cache_capacity"]["float32_weights"] = lambda: (
    _fits(total=80 * 2**30 - 4 * _PARAMS_7B),)
WRONG["check_cache_capacity"]["swapped"] = lambda: (_fits_swapped,)


# --- chapter 12: more planted mistakes (final round) ---
# Exercise 12.2: a pre_norm(block, x, mask=None) that does not pass its
# mask on to attention is named (check_pre_norm now calls it with a
# padding mask); Llama's norm1 and norm2 swapped get their own hint.

def _pre_norm_mask_ignored(block, x, mask=None):
    h = x + block.attn(block.norm1(x), need_weights=False)[0]
    return h + block.linear2(block.activation(block.linear1(block.norm2(h))))


def _pre_norm_masked(block, x, mask=None):
    h = x + block.attn(block.norm1(x), mask=mask, need_weights=False)[0]
    return h + block.linear2(block.activation(block.linear1(block.norm2(h))))


def _llama_swapped_norms(p, x):
    h = x + p.attn(p.norm2(x), need_weights=False)[0]
    z = p.norm1(h)
    return h + p.w2(F.silu(p.w1(z)) * p.w3(z))


WRONG["check_pre_norm"]["mask_ignored"] = lambda: (_pre_norm_mask_ignored,)
RIGHT["check_pre_norm"].append(lambda: (_pre_norm_masked,))
WRONG["check_llama_block"]["swapped_norms"] = lambda: (_llama_swapped_norms,)


def test_chapter12_final_pre_norm_is_called_with_its_mask():
    verdict = _check("check_pre_norm", (_pre_norm_mask_ignored,))
    assert "pass the mask on to attention" in verdict.message, verdict.message
    assert _check("check_pre_norm", RIGHT["check_pre_norm"][0]())

# --- chapter 18: more planted mistakes (final round) ---
# Exercise 18.4: rotating what carries no positions, in four more ways:
# only the latents, only the latent queries, the content queries before
# the absorption and the latents, the joined [latent; rotary] vectors.


def _scores18_rotated(m, x, where):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)  # (B, H, L, D)
    q_r = split_heads(m.q_rope_proj(x), heads)  # (B, H, L, R)
    k_r, c = m.k_rope_proj(x), m.kv_down(x)  # (B, L, R), (B, L, C)
    w = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    if where == "content":
        q, c = apply_rotary(q, pos), apply_rotary(c, pos)
    latent_q = q @ w  # (B, H, L, C)
    if where == "whole":
        q_j = apply_rotary(torch.cat([latent_q, q_r], -1), pos)
        k_j = apply_rotary(torch.cat([c, k_r], -1), pos)
        return q_j @ k_j[:, None].mT / math.sqrt(m.head_dim + m.rope_dim)
    if where == "query":
        latent_q = apply_rotary(latent_q, pos)
    if where == "latents":
        c = apply_rotary(c, pos)
    s = (latent_q @ c[:, None].mT
         + apply_rotary(q_r, pos) @ apply_rotary(k_r, pos)[:, None].mT)
    return s / math.sqrt(m.head_dim + m.rope_dim)


for _where in ("latents", "query", "content", "whole"):
    WRONG["check_absorbed_scores"][f"latent_rotated/{_where}"] = (
        lambda where=_where: (
            lambda m, x: _scores18_rotated(m, x, where),))
# Exercise 18.5 (new): FLOPs per byte of MLA's absorbed decoding, each
# classic mistake planted, two styles of right answer.


def _flops_per_byte(h, s, d_k, d_v):
    return 2 * h * s * (d_k + d_v) / (2 * d_k)


RIGHT["check_decode_flops_per_byte"] = [
    lambda: (_flops_per_byte,),
    lambda: (lambda h, s, d_k, d_v: h * s * (1 + d_v / d_k),),
]
WRONG["check_decode_flops_per_byte"] = {
    "half_flops": lambda: (lambda h, s, k, v: h * s * (k + v) / (2 * k),),
    "numbers": lambda: (lambda h, s, k, v: 2 * h * s * (k + v) / k,),
    "kv_apart": lambda: (lambda h, s, k, v: h * s * (k + v) / (k + v),),
    "kv_apart/scores_only": lambda: (
        lambda h, s, k, v: 2 * h * s * k / (2 * k),),
    "no_new_tokens": lambda: (lambda h, s, k, v: h * (k + v) / k,),
    "per_head": lambda: (lambda h, s, k, v: s * (k + v) / k,),
    "approximate": lambda: (lambda h, s, k, v: 2 * h * s,),
    "inverted": lambda: (lambda h, s, k, v: 1 / _flops_per_byte(h, s, k,
                                                                 v),),
}

# --- chapter 17: more planted mistakes (final round) ---
# Exercise 17.1: the window turned forward, (k >= q) & (k - q < w), gets
# its own hint (the review's classic answer).
WRONG["check_document_window_mod"]["forward"] = lambda: (
    lambda d, w: lambda b, h, q, kv: (
        (d[q] == d[kv]) & (kv >= q) & (kv - q < w)),)


# Exercise 17.1: the conditions joined with | instead of & (the review's
# same | window, and all three with |) get their own hint.
WRONG["check_document_window_mod"]["or_for_and"] = lambda: (
    lambda d, w: lambda b, h, q, kv: (
        (d[q] == d[kv]) | ((q >= kv) & (q - kv < w))),)
WRONG["check_document_window_mod"]["or_for_and/all"] = lambda: (
    lambda d, w: lambda b, h, q, kv: (
        (d[q] == d[kv]) | (q >= kv) | (q - kv < w)),)


def test_chapter17_final_forward_window_is_named():
    verdict = _check("check_document_window_mod", WRONG[
        "check_document_window_mod"]["forward"]())
    assert not verdict and "looks forward" in verdict.message, verdict

# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.3: ("p", "ug</w>") as the third merge is both the unweighted
# count and a misread 7 against 8: the hint gives the two weighted counts.


def test_chapter1_final_p_for_b_names_both_counts():
    verdict = _check("check_bpe_merges", WRONG["check_bpe_merges"][
        "unweighted"]())
    message = " ".join(verdict.message.split())
    assert not verdict.ok
    assert "8 times (bug)" in message and "7 times (pug)" in message
    assert "would tie" not in message  # states the counts, guesses no cause

# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.4: a mask without the diagonal (j < past + i), built with
# SDPA or by hand, gets 14.3's hint, not the generic "different values";
# the wrong-axis hint after the exception text starts a sentence.

def _step_no_diagonal(by_hand):
    def step(q, k_new, v_new, past_k, past_v):
        k = torch.cat([past_k, k_new], dim=2)
        v = torch.cat([past_v, v_new], dim=2)
        past = past_k.size(2)
        j = torch.arange(k.size(2))
        i = torch.arange(q.size(2))[:, None]
        mask = j < past + i  # the diagonal left out
        if not by_hand:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return out, k, v
        scores = (q @ k.mT / q.size(-1) ** 0.5).masked_fill(
            ~mask, float("-inf"))
        return scores.softmax(-1) @ v, k, v
    return step


WRONG["check_cached_step"]["no_diagonal"] = lambda: (
    _step_no_diagonal(False),)
WRONG["check_cached_step"]["no_diagonal/by_hand"] = lambda: (
    _step_no_diagonal(True),)


def test_cached_step_names_the_missing_diagonal():
    for name in ("no_diagonal", "no_diagonal/by_hand"):
        verdict = _check("check_cached_step",
                         WRONG["check_cached_step"][name]())
        assert not verdict.ok
        assert "leaves out the diagonal" in verdict.message, verdict


def test_cached_step_wrong_axis_hint_starts_a_sentence():
    verdict = _check("check_cached_step", (_step_cat_on(1),))
    assert ". The concatenation is on the wrong axis" in verdict.message

# --- chapter 18: more planted mistakes (final round) ---
# Exercise 18.4: keys rebuilt by hand from m.k_up.weight (no m.k_up
# call), merged or one head at a time, are refused as rebuilt keys;
# exercise 18.5: integer division // is named.


def _scores18_by_hand(m, x, per_head=False):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)
    q_r = apply_rotary(split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)[:, None]
    c, w, d = m.kv_down(x), m.k_up.weight, m.head_dim
    if per_head:
        s = torch.stack([q[:, h] @ (c @ w[h * d:(h + 1) * d].T).mT
                         for h in range(heads)], 1)
    else:
        s = q @ split_heads(c @ w.T, heads).mT  # keys rebuilt
    return (s + q_r @ k_r.mT) / math.sqrt(d + m.rope_dim)


WRONG["check_absorbed_scores"]["rebuilt_keys/by_hand"] = lambda: (
    _scores18_by_hand,)
WRONG["check_absorbed_scores"]["rebuilt_keys/per_head"] = lambda: (
    lambda m, x: _scores18_by_hand(m, x, per_head=True),)
WRONG["check_decode_flops_per_byte"]["floor_division"] = lambda: (
    lambda h, s, k, v: 2 * h * s * (k + v) // (2 * k),)


def test_chapter18_final_keys_by_hand_and_floor_division_are_named():
    verdict = _check("check_absorbed_scores",
                     WRONG["check_absorbed_scores"]["rebuilt_keys/by_hand"]())
    assert "by hand" in verdict.message, verdict.message
    verdict = _check("check_decode_flops_per_byte", WRONG[
        "check_decode_flops_per_byte"]["floor_division"]())
    assert "//" in verdict.message, verdict.message


# --- chapter 13: more planted mistakes (final round) ---
# Exercise 13.1: the softmax's 5 B H L^2 FLOPs added to Q K^T's (the
# page's table lists them next to it); 13.2: the scores counted with the
# weights (two (B, H, L, L) tensors).
def _intensity_softmax_added(b, length, d, h, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    flops = 2 * b * h * length ** 2 * (d // h) + 5 * b * h * length ** 2
    return flops / ((2 * b * length * d + b * h * length ** 2) * size)


WRONG["check_score_intensity"]["softmax_flops"] = lambda: (
    _intensity_softmax_added,)
WRONG["check_weights_mib"]["scores_too"] = lambda: (
    lambda b, length, h, dtype: 2 * b * h * length ** 2 * (
        torch.finfo(dtype).bits // 8) / 2**20,)


def test_chapter13_final_softmax_and_scores_are_named():
    for checker, name, words in (
            ("check_score_intensity", "softmax_flops", "softmax"),
            ("check_weights_mib", "scores_too", "scores S")):
        verdict = _check(checker, WRONG[checker][name]())
        assert not verdict and words in verdict.message, verdict

# --- chapter 12: more planted mistakes (final round) ---
# Exercise 12.2 is now causal, as Llama is: the right answers pass
# is_causal=True (or the causal mask); the forward without a mask is a
# named mistake, and every earlier planted layout, written without the
# mask, still gets its own hint. Attention fed norm1(x) as the query only
# is named in check_llama_block; an inverted mask in check_pre_norm.

def _llama_causal(p, x, kv=None, is_causal=True, mask=None):
    h = p.norm1(x)
    kv = h if kv is None else kv
    h = x + p.attn(h, kv, kv, mask=mask, need_weights=False,
                   is_causal=is_causal)[0]
    z = p.norm2(h)
    return h + p.w2(F.silu(p.w1(z)) * p.w3(z))


def _pre_norm_inverted(block, x, mask=None):
    h = x + block.attn(block.norm1(x), mask=None if mask is None else ~mask,
                       need_weights=False)[0]
    return h + block.linear2(block.activation(block.linear1(block.norm2(h))))


RIGHT["check_llama_block"] = [
    lambda: (_llama_causal,),
    lambda: (lambda p, x: _llama_causal(
        p, x, is_causal=False, mask=causal_mask(x.size(1))),)]
del WRONG["check_llama_block"]["causal_mask"]
WRONG["check_llama_block"]["no_mask"] = lambda: (
    lambda p, x: _llama_causal(p, x, is_causal=False),)
WRONG["check_llama_block"]["raw_key_value"] = lambda: (
    lambda p, x: _llama_causal(p, x, kv=x),)
WRONG["check_llama_block"]["raw_key_value/no_mask"] = lambda: (
    lambda p, x: _llama_causal(p, x, kv=x, is_causal=False),)
WRONG["check_pre_norm"]["inverted_mask"] = lambda: (_pre_norm_inverted,)


def test_chapter12_final_pre_norm_says_when_the_mask_is_not_checked():
    two = _check("check_pre_norm", (pre_norm,))  # third argument: no mask
    three = _check("check_pre_norm", (_pre_norm_masked,))
    assert not two and "takes no mask" in two.message
    assert three and "not checked" not in three.message


# --- chapter 13: more planted mistakes (round 40) ---

WRONG["check_weights_mib"]["one_batch"] = lambda: (
    lambda b, length, h, dtype: h * length * length
    * (torch.finfo(dtype).bits // 8) / 2**20,)
WRONG["check_tiled_softmax"]["whole_row/special"] = lambda: (
    lambda s, b: torch.special.softmax(s, -1),)


@pytest.mark.parametrize("name, fn", [
    ("special_softmax", lambda s, b: torch.special.softmax(s, -1)),
    ("log_softmax", lambda s, b: F.log_softmax(s, -1).exp()),
    ("exp2", lambda s, b: torch.exp2(s)
     / torch.exp2(s).sum(-1, keepdim=True)),
])
def test_chapter13_round40_whole_row_names_the_call(name, fn):
    verdict = _check("check_tiled_softmax", (fn,))
    assert not verdict and f"called {name} on 7 scores" in verdict.message

# --- chapter 17: more planted mistakes (final round) ---
# Exercise 17.3: a score_mod that closes over a fixed slopes tensor (the
# page's slopes4) and the decoder's causal ALiBi pasted into the encoder
# each get their own hint, not "N of 224 entries are off".
_SLOPES4 = torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)])
WRONG["check_bidirectional_alibi"]["fixed_slopes"] = lambda: (
    lambda s: lambda score, b, h, q, kv: (
        score - _SLOPES4[h] * (q - kv).abs()),)
WRONG["check_bidirectional_alibi"]["causal"] = lambda: (
    lambda s: lambda score, b, h, q, kv: torch.where(
        q >= kv, score - s[h] * (q - kv), -math.inf),)


def test_chapter17_final_fixed_slopes_and_causal_alibi_are_named():
    for name, words in (("fixed_slopes", "fixed outside"),
                        ("causal", "an encoder has no causal mask")):
        verdict = _check("check_bidirectional_alibi",
                         WRONG["check_bidirectional_alibi"][name]())
        assert not verdict and words in verdict.message, verdict

# --- chapter 12: more planted mistakes (final round) ---
# Exercise 12.1: one LayerNorm too many per block (+2 d). Exercise 12.4:
# attention counted with two d x d matrices (K and V shared, as in GQA).

WRONG["check_block_params"]["three_norms"] = lambda: (
    lambda d, f: block_params(d, f) + 2 * d,)
WRONG["check_llama_block_params"]["two_attention_matrices"] = lambda: (
    lambda d, f: _llama_params(d, f) - 2 * d * d,)

# --- chapter 12: more planted mistakes (round 70) ---
# Exercise 12.1: the biases counted twice, attention's four alone (+4 d) or
# all six (+5 d + d_ff).

WRONG["check_block_params"].update({
    "attention_biases_twice": lambda: (
        lambda d, f: block_params(d, f) + 4 * d,),
    "biases_twice": lambda: (
        lambda d, f: block_params(d, f) + 5 * d + f,),
})


# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.1: num_kv_heads counted twice in kv_cache_bytes; fits with a
# float32 cache, or with 32 key/value heads hard-coded (its argument
# ignored). Exercise 14.4: a float 0/1 attn_mask (SDPA adds it to the
# scores), and the scores divided by D instead of sqrt(D).

def _bytes_kv_twice(num_layers, num_kv_heads, head_dim, length, batch,
                    bytes_per_number):
    return 2 * num_layers * num_kv_heads ** 2 * head_dim * length \
        * batch * bytes_per_number


def _fits_float32_cache(num_kv_heads):
    free = 80 * 2**30 - 2 * _PARAMS_7B
    per_token = 2 * 32 * num_kv_heads * 128 * 4
    return free // (4096 * per_token), free // (32 * per_token)


def _fits_kv_ignored(num_kv_heads):
    return _fits()(32)


def _step_float_mask(q, k_new, v_new, past_k, past_v):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    mask = causal_mask(q.size(2), k.size(2)).float()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), k, v


def _step_scaled_by_d(q, k_new, v_new, past_k, past_v):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    mask = causal_mask(q.size(2), k.size(2))
    w = (q @ k.mT / q.size(-1)).masked_fill(~mask, float("-inf"))
    return w.softmax(-1) @ v, k, v


WRONG["check_cache_bytes"]["kv_heads_twice"] = lambda: (_bytes_kv_twice,)
WRONG["check_cache_capacity"]["float32_cache"] = lambda: (
    _fits_float32_cache,)
WRONG["check_cache_capacity"]["kv_ignored"] = lambda: (_fits_kv_ignored,)
WRONG["check_cached_step"]["float_mask"] = lambda: (_step_float_mask,)
WRONG["check_cached_step"]["scaled_by_d"] = lambda: (_step_scaled_by_d,)


# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.2: float ids or float lengths get one named hint (ids and
# lengths alike: whole numbers), not a bare dtype message for the ids only.
WRONG["check_padded_batch"]["floats"] = lambda: (
    [[12.0, 13, 3, 8], [1, 2, 10, 0]], [4, 3])
WRONG["check_padded_batch"]["floats/lengths"] = lambda: (
    [[12, 13, 3, 8], [1, 2, 10, 0]], [4.0, 3.0])
WRONG["check_padded_batch"]["floats/tensors"] = lambda: (
    torch.tensor([[12, 13, 3, 8], [1, 2, 10, 0]]),
    torch.tensor([4.0, 3.0]))


# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.4: the scores of the padded (4, 6) batch that involve a pad
# (27 of 144); each classic miscount gets its hint.
RIGHT["check_pad_scores"] = [lambda: (27,), lambda: (torch.tensor(27),)]
WRONG["check_pad_scores"] = {
    "one_side": lambda: (18,),
    "pad_pad_twice": lambda: (36,),
    "pad_pad_only": lambda: (9,),
    "no_pad": lambda: (117,),
    "share": lambda: (27 / 144,),
    "share/percent": lambda: (18.75,),
    "pads": lambda: (3,),
}


def test_chapter1_final_pad_scores_refuses_a_string_and_a_near_miss():
    assert not _check("check_pad_scores", ("27",))
    verdict = _check("check_pad_scores", (28,))
    assert not verdict and "27" not in verdict.message

# --- chapter 1: more planted mistakes (final round) ---
# Exercise 1.2: the two lengths in the wrong order ([3, 4]) get their own
# hint, not a generic "off by up to 1".
WRONG["check_padded_batch"]["swapped_lengths"] = lambda: (
    [[12, 13, 3, 8], [1, 2, 10, 0]], [3, 4])


# --- chapter 12: more planted mistakes (final round) ---
# Exercise 12.4: Exercise 12.1's biases and LayerNorm betas carried into
# the Llama count (SwiGLU's three biases, or 12.1's d_ff + d). Exercise
# 12.2: F.layer_norm without the gain for both RMSNorms.

WRONG["check_llama_block_params"]["carried_over"] = lambda: (
    lambda d, f: _llama_params(d, f) + 4 * d + 2 * f + d + 2 * d,)
WRONG["check_llama_block_params"]["carried_over/ffn"] = lambda: (
    lambda d, f: _llama_params(d, f) + 4 * d + f + d + 2 * d,)


def _llama_layer_norm(p, x):
    def n(h):
        return F.layer_norm(h, h.shape[-1:])
    h = x + p.attn(n(x), need_weights=False, is_causal=True)[0]
    z = n(h)
    return h + p.w2(F.silu(p.w1(z)) * p.w3(z))


WRONG["check_llama_block"]["layer_norm_no_gain"] = lambda: (
    _llama_layer_norm,)


# --- chapter 17: more planted mistakes (final round) ---
# Exercise 17.5: the loop started at n - W without max(0, ...), which
# writes negative positions when n < W. Exercise 17.3: a squared distance.
WRONG["check_ring_held"]["unclamped"] = lambda: (
    lambda n, w: _ring_unclamped(n, w),)
WRONG["check_bidirectional_alibi"]["squared"] = lambda: (
    lambda s: lambda score, b, h, q, kv: score - s[h] * (q - kv) ** 2,)


def _ring_unclamped(n, window):
    held = [-window] * window
    for t in range(n - window, n):  # no max(0, ...)
        held[t % window] = t
    return held


# --- chapter 11: more planted mistakes (final round) ---
# Exercise 11.2: a bool key_padding_mask with a float attn_mask (PyTorch
# warns that mixing the kinds is deprecated; Appendix A's rule 1).
WRONG["check_torch_masks"]["mixed_kinds"] = lambda: (lambda n, length: (
    ~padding_mask(n, length)[:, 0, 0],
    nn.Transformer.generate_square_subsequent_mask(length)),)
WRONG["check_torch_masks"]["mixed_kinds/float_padding"] = lambda: (
    lambda n, length: (
        torch.zeros(len(n), length).masked_fill(
            ~padding_mask(n, length)[:, 0, 0], float("-inf")),
        ~causal_mask(length)),)

# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.3: the tril/triu mix-up, triu(past), gets its own hint; the
# last q_len rows of a square tril are accepted as the bottom-right mask.
WRONG["check_chunk_mask"]["triu"] = lambda: (
    lambda q, p: torch.ones(q, p + q, dtype=torch.bool).triu(p),)


def test_chapter14_final_square_tril_rows_are_accepted():
    verdict = _check("check_chunk_mask", (
        lambda q, p: torch.ones(p + q, p + q, dtype=torch.bool).tril()[-q:],))
    assert verdict and "lower triangle" in verdict.message, verdict.message

# --- chapter 18: more planted mistakes (final round) ---
# Exercise 18.4: head 0's block k_up.weight[:D] for every head gets its
# own hint (18.1's checker names it too); exercise 18.5: float32's 4
# bytes a number gives the same value as half the FLOPs: one hint names
# both.


def _scores18_head_zero(m, x):
    heads, pos, d = m.num_heads, torch.arange(x.size(1)), m.head_dim
    q = split_heads(m.q_proj(x), heads)
    q_r = apply_rotary(split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)[:, None]
    s = (q @ m.k_up.weight[:d]) @ m.kv_down(x)[:, None].mT
    return (s + q_r @ k_r.mT) / math.sqrt(d + m.rope_dim)


WRONG["check_absorbed_scores"]["head_zero"] = lambda: (
    _scores18_head_zero,)
WRONG["check_decode_flops_per_byte"]["half_flops/float32"] = lambda: (
    lambda h, s, k, v: 2 * h * s * (k + v) / (4 * k),)


@pytest.mark.parametrize("checker, name", [
    ("check_absorbed_scores", "head_zero"),
    ("check_decode_flops_per_byte", "half_flops/float32"),
    ("check_decode_flops_per_byte", "half_flops")])
def test_chapter18_final_head_zero_and_float32_are_named(checker, name):
    test_the_planted_mistake_is_refused_with_its_hint(checker, name)
    verdict = _check(checker, WRONG[checker][name]())
    assert ("head 0" in verdict.message if name == "head_zero"
            else "float32" in verdict.message), verdict.message

# --- chapter 14: more planted mistakes (final round) ---
# Exercise 14.4: a mask over the new tokens alone, causal_mask(q_len),
# the cache left out, fails to broadcast against the cached keys: the
# shape error is named, through SDPA and by hand.


def _step_square_mask(q, k_new, v_new, past_k, past_v):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_mask(q.size(2)))
    return out, k, v


def _step_square_mask_by_hand(q, k_new, v_new, past_k, past_v):
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    scores = q @ k.mT / q.size(-1) ** 0.5
    scores = scores.masked_fill(~causal_mask(q.size(2)), float("-inf"))
    return scores.softmax(-1) @ v, k, v


WRONG["check_cached_step"]["square_mask"] = lambda: (_step_square_mask,)
WRONG["check_cached_step"]["square_mask/fill"] = lambda: (
    _step_square_mask_by_hand,)


@pytest.mark.parametrize("name", ["square_mask", "square_mask/fill"])
def test_chapter14_final_square_mask_is_named(name):
    test_the_planted_mistake_is_refused_with_its_hint(
        "check_cached_step", name)
    verdict = _check("check_cached_step", WRONG["check_cached_step"][name]())
    assert "causal_mask(q_len, past + q_len)" in verdict.message

# --- chapter 1: more planted mistakes (final round) ---
# Exercises 1.2 and 1.4: an answer that matches no catalogued mistake
# (one id off, a count of 46) still names the section that explains it.


@pytest.mark.parametrize("checker, args", [
    ("check_pad_scores", (46,)),
    ("check_padded_batch", ([[12, 13, 3, 8], [1, 2, 11, 0]], [4, 3])),
    ("check_padded_batch", ([[12, 13, 3, 8], [1, 2, 10, 0]], [4, 1]))])
def test_chapter1_final_unmatched_answers_name_the_section(checker, args):
    verdict = getattr(exercises, checker)(*args)
    assert not verdict, verdict.message
    assert ("(see 'Padding sentences of different lengths' in chapter 1)"
            in verdict.message), verdict.message


# --- chapter 17: more planted mistakes (final round) ---
# Exercise 17.4: the cap inverted, tanh(score * cap) / cap.
WRONG["check_softcap_score_mod"]["inverted"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: torch.tanh(s * cap) / cap,)



# --- chapter 18: more planted mistakes (round 46) ---
# Exercise 18.4: the shared rotary key (B, L, R) or the latents (B, L, C)
# without their head axis, q_r @ k_r.mT, or with it in front, k_r[None]:
# broadcasting meets their batch axis with the heads, which runs only where
# B = H (the checker's first module, 2 and 2) and there scores head h
# against sequence h's keys; and the scores returned (H, B, L, L), a swap
# the same equal sizes hide.


def _scores18_head_axis(m, x, where):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)  # (B, H, L, D)
    q_r = apply_rotary(split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R)
    c = m.kv_down(x)  # (B, L, C)
    latent_q = q @ m.k_up.weight.unflatten(0, (heads, -1))  # (B, H, L, C)
    k_r = {"rope": k_r, "both": k_r, "front": k_r[None]}.get(
        where, k_r[:, None])
    c = c if where in ("latent", "both") else c[:, None]
    s = (latent_q @ c.mT + q_r @ k_r.mT) / math.sqrt(
        m.head_dim + m.rope_dim)
    return s.transpose(0, 1) if where == "swapped" else s


for _where in ("rope", "latent", "both", "front"):
    WRONG["check_absorbed_scores"][f"head_axis/{_where}"] = (
        lambda where=_where: (
            lambda m, x: _scores18_head_axis(m, x, where),))
WRONG["check_absorbed_scores"]["heads_swapped"] = lambda: (
    lambda m, x: _scores18_head_axis(m, x, "swapped"),)


# --- chapters 10 and 11: more planted mistakes (round 48) ---
# Exercise 11.2: either slot may be None. One per-head attn_mask
# (B * num_heads, L, L), True = blocked, with no key_padding_mask is right
# (Appendix A's table); a None where a mask is needed, an integer mask
# (Hugging Face's attention_mask, 1 = real token), the lengths for the mask,
# a key_padding_mask repeated per head, and per-head rows in head-major
# order (.repeat for .repeat_interleave) are named.
def _per_head_blocked(valid_lens, length, order="sentence"):
    heads = 4  # the checker's module
    blocked = ~(padding_mask(valid_lens, length)[:, 0] & causal_mask(length))
    return (blocked.repeat_interleave(heads, 0) if order == "sentence"
            else blocked.repeat(heads, 1, 1))  # (B * H, L, L)


RIGHT["check_torch_masks"] += [
    lambda: (lambda n, length: (None, _per_head_blocked(n, length)),),
    lambda: (lambda n, length: (
        torch_masks(n, length)[0],
        torch_masks(n, length)[1].expand(len(n) * 4, -1, -1)),),
]
WRONG["check_torch_masks"].update({
    "causal_missing": lambda: (lambda n, length: (torch_masks(n, length)[0], None),),
    "padding_missing": lambda: (lambda n, length: (None, torch_masks(n, length)[1]),),
    "no_masks": lambda: (lambda n, length: (None, None),),
    "int_mask": lambda: (lambda n, length: (
        padding_mask(n, length)[:, 0, 0].long(), ~causal_mask(length)),),
    "int_mask/blocked_as_one": lambda: (lambda n, length: (
        (~padding_mask(n, length)[:, 0, 0]).long(), ~causal_mask(length)),),
    "int_mask/attn_mask": lambda: (lambda n, length: (
        torch_masks(n, length)[0], torch.ones(length, length).triu(1).long()),),
    "lengths": lambda: (lambda n, length: (n, ~causal_mask(length)),),
    "padding_shape/per_head": lambda: (lambda n, length: (
        torch_masks(n, length)[0].repeat_interleave(4, 0),
        torch_masks(n, length)[1]),),
    "per_head_order": lambda: (lambda n, length: (
        None, _per_head_blocked(n, length, order="head")),),
})
# Exercise 10.2: the pads blocked as queries (rows) too, or instead of as keys.
WRONG["check_einops_mask"].update({
    "pad_queries": lambda: (lambda n, length: ~(
        padding_mask(n, length)[:, 0].mT & causal_mask(length)),),
    "pad_queries/both": lambda: (lambda n, length: ~(
        padding_mask(n, length)[:, 0] & padding_mask(n, length)[:, 0].mT
        & causal_mask(length)),),
})


@pytest.mark.parametrize("answer", [
    (None, "per_head"), ("valid", None), (None, "causal"), (None, None),
    (None, "per_head_float"), ("valid_float", None)])
def test_torch_masks_takes_none_in_either_slot(answer):
    def fn(n, length):
        masks = {
            "valid": torch_masks(n, length)[0],
            "causal": torch_masks(n, length)[1],
            "per_head": _per_head_blocked(n, length),
            "per_head_float": torch.zeros(len(n) * 4, length, length).masked_fill(
                _per_head_blocked(n, length), float("-inf")),
            "valid_float": torch.zeros(len(n), length).masked_fill(
                torch_masks(n, length)[0], float("-inf")),
        }
        return tuple(None if a is None else masks[a] for a in answer)

    verdict = _check("check_torch_masks", (fn,))
    assert "Traceback" not in verdict.message
    assert bool(verdict) == (answer[0] is None and answer[1] is not None
                             and answer[1].startswith("per_head"))
    if verdict:  # the float form is named as float first
        assert ("additive float" if answer[1].endswith("float")
                else "per head") in verdict.message
    else:
        assert "(see '" in verdict.message  # a named hint


def test_torch_masks_names_a_list_for_a_tensor():
    verdict = _check("check_torch_masks", (lambda n, length: (
        torch_masks(n, length)[0].tolist(), torch_masks(n, length)[1]),))
    assert not verdict
    assert "should be a tensor or None, got list" in verdict.message
# --- chapter 17: more planted mistakes (round 48) ---
# Exercise 17.2: the slopes in base e, exp(-8 (h + 1) / H), not base 2.

WRONG["check_alibi_slopes"]["base_e"] = lambda: (
    lambda n: [math.exp(-8 * (h + 1) / n) for h in range(n)],)
# --- chapter 1: more planted mistakes (round 48) ---
# Exercise 1.1: only a comma followed by a space deleted, ", " for ","
# (the comma of "1,000" stays, although nothing was stripped). Exercise
# 1.2: each row's last index (counting from 0) for its length, [3, 2].
# Exercise 1.4: the inclusion-exclusion sign error, 18 + 18 + 9 = 45; 27
# counted in every sentence, 4 x 27 = 108; all 144 scores less the 18 with
# a pad as the query, 126. learn_bpe's exercise copy stops when no pair is
# left instead of raising IndexError.
WRONG["check_tokenizer"]["comma_space"] = lambda: (
    lambda t: tokenize(t.replace(", ", " ")),)
WRONG["check_tokenizer"]["comma_space/regex"] = lambda: (
    lambda t: tokenize(re.sub(r",\s", " ", t)),)
WRONG["check_padded_batch"]["last_index"] = lambda: (
    [[12, 13, 3, 8], [1, 2, 10, 0]], [3, 2])
WRONG["check_pad_scores"].update({
    "pad_pad_added": lambda: (45,),
    "every_sentence": lambda: (108,),
    "query_rows_only": lambda: (126,),
})


def test_chapter1_round48_strip_still_names_stripping():
    verdict = _check("check_tokenizer", (lambda t: [
        w.strip(",") for w in tokenize(t)],))
    assert CATALOGUE["check_tokenizer"]["inner_comma"].message \
        in verdict.message, verdict.message


def test_chapter1_round48_bpe_copy_stops_when_no_pair_is_left():
    from mha_lib.exercises.chapter01 import _bpe
    assert _bpe({"a": 3}, 5) == [("a", "</w>")]
    assert _bpe({"ab": 2, "b": 1}, 9) == [("b", "</w>"), ("a", "b</w>")]
# --- chapter 14: more planted mistakes (round 48) ---
# Exercise 14.1, second half: the length at batch 32 computed from one
# sequence's position (batch 1): exactly 32 times too long; and the whole
# model in float32 (4-byte weights and 4-byte cache numbers). Exercise 14.2:
# repeat_interleave(H) makes H copies of each key/value head, not g.

def _fits_length_one_sequence(num_kv_heads):
    free = 80 * 2**30 - 2 * _PARAMS_7B
    sequence = 2 * 32 * num_kv_heads * 128 * 4096 * 2
    position = 2 * 32 * num_kv_heads * 128 * 1 * 2  # batch 1, not 32
    return free // sequence, free // position


def _fits_all_float32(num_kv_heads):
    free = 80 * 2**30 - 4 * _PARAMS_7B
    sequence = 2 * 32 * num_kv_heads * 128 * 4096 * 4
    position = 2 * 32 * num_kv_heads * 128 * 32 * 4
    return free // sequence, free // position


WRONG["check_cache_capacity"]["length_one_sequence"] = lambda: (
    _fits_length_one_sequence,)
WRONG["check_cache_capacity"]["all_float32"] = lambda: (_fits_all_float32,)
WRONG["check_expand_kv"]["h_copies"] = lambda: (
    lambda x, h: x.repeat_interleave(h, dim=1),)
WRONG["check_expand_kv"]["h_copies/repeat"] = lambda: (
    lambda x, h: x.unsqueeze(2).expand(-1, -1, h, -1, -1).flatten(1, 2),)
# --- chapter 18: exercise 18.5's hints (round 48) ---
# FlashMLA's FLOPs-per-byte count has its own section; a hint that sent the
# reader to the cache-bytes table named a section without the count.

def test_chapter18_flops_per_byte_hints_name_the_section_with_the_count():
    verdict = _check("check_decode_flops_per_byte",
                     (lambda h, s, d_k, d_v: 2 * h * s,))  # approximate
    assert not verdict
    assert "'What bounds a decoding step' in chapter 18" in verdict.message
    assert {m.section for m in CATALOGUE["check_decode_flops_per_byte"]
            .values()} == {"What bounds a decoding step"}
# --- chapter 1: more planted mistakes (round 50) ---
# Exercise 1.1: ", " deleted, comma and space together, which glues
# "Hello, what" into "hellowhat" (round 48's hint caught only ", " -> " ");
# the tokens returned joined into one string. Exercise 1.3: the split of
# bugs written as one string. Exercise 1.4: the pads' share of the last
# row's scores (0.75, or 75 %) and any other share; all 144 scores less the
# last row's 9 real pairs (135); the 24 positions; the 21 real tokens.
WRONG["check_tokenizer"].update({
    "glued_words": lambda: (lambda t: tokenize(t.replace(", ", "")),),
    "glued_words/regex": lambda: (lambda t: tokenize(re.sub(r",\s*", "", t)),),
    "joined_string": lambda: (lambda t: " ".join(tokenize(t.replace(",", ""))),),
})
WRONG["check_bpe_split"]["one_string"] = lambda: ("b ug s </w>",)
WRONG["check_pad_scores"].update({
    "share/row": lambda: (0.75,),
    "share/row_percent": lambda: (75,),
    "share/other": lambda: (0.5,),
    "all_less_real_row": lambda: (135,),
    "positions": lambda: (24,),
    "real_tokens": lambda: (21,),
})
# --- chapter 12: more planted mistakes (round 50) ---
# Exercise 12.2, as a reader writes them: both residuals left out; the
# causal mask inverted, mask=~causal_mask(L); the SiLU on the product,
# silu(w1(z) * w3(z)); norm2 forgotten, so the FFN reads the raw stream.
# Exercise 12.4: Exercise 12.1's attention and FFN biases carried into the
# Llama count, with RMSNorms of gamma only.


def _llama_r50(p, x, how):
    mask = ~causal_mask(x.size(1)) if how == "inverted_mask" else None
    h = p.attn(p.norm1(x), mask=mask, need_weights=False,
               is_causal=mask is None)[0]
    h = h if how == "no_residual" else x + h
    z = h if how == "raw_ffn_input" else p.norm2(h)
    if how == "silu_of_product":
        f = p.w2(F.silu(p.w1(z) * p.w3(z)))
    else:
        f = p.w2(F.silu(p.w1(z)) * p.w3(z))
    return f if how == "no_residual" else h + f


WRONG["check_llama_block"].update({
    name: (lambda name=name: (lambda p, x: _llama_r50(p, x, name),))
    for name in ("no_residual", "inverted_mask", "silu_of_product",
                 "raw_ffn_input")})
WRONG["check_llama_block_params"]["all_biases/no_betas"] = lambda: (
    lambda d, f: 4 * d * d + 4 * d + 3 * d * f + f + d + 2 * d,)

# --- chapter 18: two wrong answers with generic feedback (round 50) ---
# Exercise 18.2: the length left out (one token's cache) was called "2 to
# 10 times too small". Exercise 18.4: the scale over sqrt(d_model / H),
# which is not the head width when head_dim is set apart, was called
# "1.22 times the right values everywhere".


def _scores18_scale_d_model(m, x, rope=False):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = split_heads(m.q_proj(x), heads)
    q_r = apply_rotary(split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)[:, None]
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))
    s = (q @ w_uk) @ m.kv_down(x)[:, None].mT + q_r @ k_r.mT
    width = x.size(-1) // heads + (m.rope_dim if rope else 0)
    return s / math.sqrt(width)


WRONG["check_latent_cache_bytes"]["no_length"] = lambda: (
    lambda c, r, length, batch, size: (c + r) * batch * size,)
WRONG["check_absorbed_scores"]["d_model_heads"] = lambda: (
    _scores18_scale_d_model,)
WRONG["check_absorbed_scores"]["d_model_heads/plus_r"] = lambda: (
    lambda m, x: _scores18_scale_d_model(m, x, rope=True),)


@pytest.mark.parametrize("checker, name, word", [
    ("check_latent_cache_bytes", "no_length", "length"),
    ("check_absorbed_scores", "d_model_heads", "d_model / H"),
    ("check_absorbed_scores", "d_model_heads/plus_r", "d_model / H")])
def test_chapter18_round50_length_and_d_model_scale_are_named(checker, name,
                                                              word):
    verdict = _check(checker, WRONG[checker][name]())
    assert not verdict
    assert word in verdict.message, verdict.message
    assert "times too small" not in verdict.message
    assert "times the right values" not in verdict.message


# --- chapter 18: the no_rope hint's expression (round 52) ---
# Exercise 18.4's hint for a missing rotary part suggested q_r @ k_r.T: on
# q_r (B, H, L, R) and k_r (B, L, R), .T reverses every axis and the product
# raises. The expression the hint names now runs on the checker's shapes, and
# added to the scores without a rotary part it gives an answer the checker
# accepts.
def test_chapter18_no_rope_hint_expression_runs_on_the_checker_shapes():
    hint = CATALOGUE["check_absorbed_scores"]["no_rope"].hint
    expression = "q_r @ k_r[:, None].mT"
    assert expression in hint, hint
    assert not any(".T," in m.hint or ".T)" in m.hint
                   for m in CATALOGUE["check_absorbed_scores"].values())

    def fixed(m, x):
        pos = torch.arange(x.size(1))
        q_r = apply_rotary(split_heads(m.q_rope_proj(x), m.num_heads), pos)
        k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R)
        rotary = eval(expression, {}, {"q_r": q_r, "k_r": k_r})
        return (_scores18(m, x, "no_rope")
                + rotary / math.sqrt(m.head_dim + m.rope_dim))

    assert _check("check_absorbed_scores", (fixed,)), "rejected"
# --- chapter 12: round 52 ---
# Exercise 12.4: Exercise 12.1's num_heads mistake, TransformerBlock's three
# arguments (d_model, num_heads, d_ff) where the checker passes two.
WRONG["check_llama_block_params"]["num_heads_argument"] = lambda: (
    lambda d, h, f: _llama_params(d, f),)
# --- chapter 1: round 54 ---
# Exercise 1.3: ["b", "ugs", "</w>"], a piece no merge makes, got only the
# generic "apply the three merges". Exercise 1.5: check_bpe_split also takes
# a function, fn(word, merges), a bpe_split the reader writes; planted: only
# the first occurrence of a pair merged, the merges applied by position
# (the leftmost pair that is a merge) or last first, no skip after a join,
# d2l's longest match, no "</w>".


def _merged56(symbols, pair):  # one merge, as a learner writes it
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def _right56(word, merges):  # a right answer, written apart from the checker
    symbols = [*word, "</w>"]
    for a, b in merges:
        symbols = _merged56(symbols, (a, b))
    return symbols


def _no_marker56(word, merges):  # never adds "</w>"
    symbols = [*word]
    for a, b in merges:
        symbols = _merged56(symbols, (a, b))
    return symbols


def _reversed56(word, merges):  # the last merge first
    return _right56(word, list(merges)[::-1])


def _leftmost56(word, merges):  # joins the leftmost pair that is a merge
    known, symbols = {tuple(m) for m in merges}, [*word, "</w>"]
    while True:
        for i in range(len(symbols) - 1):
            if (symbols[i], symbols[i + 1]) in known:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                break
        else:
            return symbols


def _overlapping56(word, merges):  # moves on by one after a join
    symbols = [*word, "</w>"]
    for a, b in merges:
        out = []
        for i, symbol in enumerate(symbols):
            if symbol == a and symbols[i + 1:i + 2] == [b]:
                out.append(a + b)
            else:
                out.append(symbol)
        symbols = out
    return symbols


def _longest56(word, merges):  # d2l's segment_BPE: longest known piece
    known = {*word, "</w>", *("".join(m) for m in merges)}
    text, out = word + "</w>", []
    while text:
        for size in range(len(text), 0, -1):
            if text[:size] in known or size == 1:
                out.append(text[:size])
                text = text[size:]
                break
    return out


def _first_only54(word, merges):  # as a reader writes it: list.index
    symbols = [*word, "</w>"]
    for a, b in merges:
        pairs = list(zip(symbols, symbols[1:], strict=False))
        if (a, b) in pairs:
            i = pairs.index((a, b))
            symbols[i:i + 2] = [a + b]
    return symbols


WRONG["check_bpe_split"].update({
    "unmade_piece": lambda: (["b", "ugs", "</w>"],),
    "first_only": lambda: (_first_only54,),
    "not_in_order": lambda: (_leftmost56,),
    "not_in_order/reversed": lambda: (_reversed56,),
    "overlapping": lambda: (_overlapping56,),
    "longest_match": lambda: (_longest56,),
    "end_marker_missing": lambda: (_no_marker56,),
})
RIGHT["check_bpe_split"] += [lambda: (_right56,),
                             lambda: (lambda w, m: tuple(_right56(w, m)),)]


def test_chapter1_round54_split_function_names_the_word():
    verdict = _check("check_bpe_split", (_first_only54,))
    assert not verdict and "'hugbug'" in verdict.message, verdict.message
    verdict = _check("check_bpe_split", (lambda w, m: 1 / 0,))
    assert not verdict


# --- chapter 1: round 56 ---
# Exercise 1.5: merging with str.replace on the space-joined symbols, as
# d2l's merge_symbols does (it joins across piece boundaries: nest), the
# trailing "</w>" dropped from a right split; d2l's "_" end marker, in
# Exercise 1.3's list and in Exercise 1.5's function.


def _replace56(word, merges):  # d2l's merge_symbols: replace on a string
    text = " ".join([*word, "</w>"])
    for a, b in merges:
        text = text.replace(a + " " + b, a + b)
    return text.split(" ")


def _marker_dropped56(word, merges):  # a right split, less a lone "</w>"
    symbols = _right56(word, merges)
    return symbols[:-1] if symbols[-1] == "</w>" else symbols


def _underscore56(word, merges):  # d2l's "_" for the end of a word
    symbols = [*word, "_"]
    for a, b in merges:
        symbols = _merged56(symbols, (a.replace("</w>", "_"),
                                      b.replace("</w>", "_")))
    return symbols


WRONG["check_bpe_split"].update({
    "string_replace": lambda: (_replace56,),
    "marker_dropped": lambda: (_marker_dropped56,),
    "d2l_marker": lambda: (["b", "ug", "s", "_"],),
    "d2l_marker/function": lambda: (_underscore56,),
})


def test_chapter1_round56_replace_split_names_nest():
    verdict = _check("check_bpe_split", (_replace56,))
    assert not verdict and "'nest'" in verdict.message, verdict.message


# Exercise 1.6 (check_byte_ids): the ids of a text before any merge, one
# per UTF-8 byte. Planted: ord() per character, UTF-16, Latin-1 (raises on
# the euro sign, or drops it), one list per character.
RIGHT["check_byte_ids"] = [
    lambda: (lambda text: list(text.encode("utf-8")),),
    lambda: (lambda text: [b for c in text for b in c.encode("utf-8")],),
    lambda: (lambda text: tuple(bytes(text, "utf-8")),),
]
WRONG["check_byte_ids"] = {
    "code_points": lambda: (lambda text: [ord(c) for c in text],),
    "utf16": lambda: (lambda text: list(text.encode("utf-16-le")),),
    "utf16/bom": lambda: (lambda text: list(text.encode("utf-16")),),
    "latin1": lambda: (lambda text: list(text.encode("latin-1")),),
    "latin1/ignore": lambda: (
        lambda text: list(text.encode("latin-1", errors="ignore")),),
    "nested": lambda: (
        lambda text: [list(c.encode("utf-8")) for c in text],),
}


# --- chapter 12: round 54 ---
# check_pre_norm: a pre_norm(block, x) without a mask parameter is refused
# (the page writes pre_norm(block, x, mask=None); a block that drops its
# mask is a decoder bug), after its unmasked output was found right.

def _pre_norm_maskless(block, x):
    h = x + block.attn(block.norm1(x), need_weights=False)[0]
    return h + block.linear2(block.activation(block.linear1(block.norm2(h))))


def _pre_norm_explicit_masked(block, x, mask=None):
    n = block.norm1(x)
    x = x + block.attn(n, n, n, mask=mask)[0]
    return x + block.linear2(block.activation(block.linear1(block.norm2(x))))


RIGHT["check_pre_norm"] = [lambda: (_pre_norm_masked,),
                           lambda: (_pre_norm_explicit_masked,)]
WRONG["check_pre_norm"]["no_mask_argument"] = lambda: (_pre_norm_maskless,)
WRONG["check_pre_norm"]["no_mask_argument/other_third"] = lambda: (
    pre_norm,)  # pre_norm(block, x, how="right"): the third is no mask


def test_chapter12_round54_maskless_pre_norm_is_not_yet():
    verdict = _check("check_pre_norm", (_pre_norm_maskless,))
    assert not verdict and "mask=None" in verdict.message, verdict.message


# Exercise 12.2 (round 54): GPT-J's parallel block, x + attn(norm1(x)) +
# ffn(norm1(x)), causal, from a TransformerBlock's parts.

def _parallel(block, x, how="right"):
    def attn(h):
        if how == "inverted_mask":
            return block.attn(h, mask=~causal_mask(h.size(1)))[0]
        return block.attn(h, is_causal=how != "no_mask")[0]

    def ffn(h):
        hidden = block.linear1(h)
        if how == "no_activation":
            return block.linear2(hidden)
        return block.linear2(block.activation(hidden))

    z = block.norm1(x)
    if how == "sequential":
        h = x + attn(z)
        return h + ffn(block.norm2(h))
    if how == "sequential_one_norm":
        h = x + attn(z)
        return h + ffn(block.norm1(h))
    if how == "post_norm":
        return block.norm1(x + attn(x) + ffn(x))
    if how == "two_norms":  # GPT-NeoX's form
        return x + attn(z) + ffn(block.norm2(x))
    if how == "raw_ffn_input":
        return x + attn(z) + ffn(x)
    if how == "no_residual":
        return attn(z) + ffn(z)
    if how == "residual_twice":
        return (x + attn(z)) + (x + ffn(z))
    if how == "output_norm":
        return F.layer_norm(x + attn(z) + ffn(z), x.shape[-1:])
    if how == "pair_sum":
        return x + block.attn(z, is_causal=True) + ffn(z)
    if how == "in_place":
        x += attn(z) + ffn(z)
        return x
    return x + attn(z) + ffn(z)


def _parallel_mask(block, x):  # the mask written out, the FFN in one line
    z = block.norm1(x)
    a, _ = block.attn(z, z, z, mask=causal_mask(x.size(1)),
                      need_weights=False)
    return x + a + block.linear2(block.activation(block.linear1(z)))


RIGHT["check_parallel_block"] = [lambda: (_parallel,),
                                 lambda: (_parallel_mask,)]
WRONG["check_parallel_block"] = {
    name: (lambda name=name: (lambda b, x: _parallel(b, x, name),))
    for name in ("sequential", "sequential_one_norm", "two_norms",
                 "raw_ffn_input", "no_residual", "residual_twice",
                 "post_norm", "output_norm", "no_mask", "inverted_mask",
                 "no_activation", "pair_sum", "in_place")}
WRONG["check_parallel_block"]["whole_block"] = lambda: (
    lambda b, x: b(x, is_causal=True)[0],)
WRONG["check_parallel_block"]["two_norms/no_mask"] = lambda: (
    lambda b, x: x + b.attn(b.norm1(x))[0]
    + b.linear2(b.activation(b.linear1(b.norm2(x)))),)
WRONG["check_parallel_block"]["sequential/no_mask"] = lambda: (
    _pre_norm_maskless,)


# --- chapter 12: the residual added to norm1(x), and SwiGLU's gate (round 56)
# Exercise 12.2's classic slip, z + attn(z) + ffn(z) with z = norm1(x), got
# the generic "entries are off"; it now has its own hint. Exercise 12.4's hints
# call the SiLU branch w1 the gate (Llama's w1 is HF's gate_proj) and name the
# exercise's parts object p, not block.
def _parallel_normalised_residual(block, x, causal=True):
    z = block.norm1(x)
    a = block.attn(z, need_weights=False, is_causal=causal)[0]
    return z + a + block.linear2(block.activation(block.linear1(z)))


WRONG["check_parallel_block"].update({
    "normalised_residual": lambda: (_parallel_normalised_residual,),
    "normalised_residual/no_mask": lambda: (
        lambda b, x: _parallel_normalised_residual(b, x, causal=False),),
})


# --- chapter 12: the parallel sum normalised (round 72)
# Exercise 12.2's norm1(x + attn(z) + ffn(z)), z = norm1(x), a post-norm slip
# on the parallel block, got the generic "entries are off"; it now has a hint.
def _parallel_sum_normalised(block, x, causal=True):
    z = block.norm1(x)
    a = block.attn(z, need_weights=False, is_causal=causal)[0]
    return block.norm1(x + a + block.linear2(block.activation(
        block.linear1(z))))


WRONG["check_parallel_block"].update({
    "sum_normalised": lambda: (_parallel_sum_normalised,),
    "sum_normalised/no_mask": lambda: (
        lambda b, x: _parallel_sum_normalised(b, x, causal=False),),
})


def test_chapter12_round56_swiglu_gate_is_w1_and_hints_name_p():
    hints = CATALOGUE["check_llama_block"]
    assert "w1" in hints["gate_swapped"].hint
    assert "gate_proj" in hints["gate_swapped"].hint
    assert not any("w3 is the" in m.hint or "gate W3" in m.hint
                   or "block.n" in m.hint or "block.a" in m.hint
                   for m in hints.values())
    assert not any("gate W3" in m.hint
                   for m in CATALOGUE["check_llama_block_params"].values())
# --- chapter 14: more planted mistakes (round 56) ---
# Exercise 14.4: the keys appended but the old past_v returned (the values
# to cache not appended), and the same for the keys, are named.

def _step_old_values(q, k, v, pk, pv):
    out, keys, _ = _step(q, k, v, pk, pv)
    return out, keys, pv


def _step_old_keys(q, k, v, pk, pv):
    out, _, values = _step(q, k, v, pk, pv)
    return out, pk, values


WRONG["check_cached_step"]["not_appended"] = lambda: (_step_old_values,)
WRONG["check_cached_step"]["not_appended/keys"] = lambda: (_step_old_keys,)


def test_cached_step_names_the_old_cache_returned():
    for name in ("not_appended", "not_appended/keys"):
        verdict = _check("check_cached_step",
                         WRONG["check_cached_step"][name]())
        assert not verdict.ok
        assert "without the new ones" in verdict.message


# --- chapter 14: exercise 14.5, attention over shared key/value heads
# without copies, under a mask (round 56) ---

def _shared(q, k, v, mask, *, transpose=False, merge=True, scale=None,
            copy=False, mask_rows="block"):
    B, H, Lq, D = q.shape  # noqa: N806
    H_kv = k.size(1)  # noqa: N806
    g = H // H_kv
    if copy:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if transpose:  # heads grouped as h % H_kv
        rows = q.reshape(B, g, H_kv, Lq, D).transpose(1, 2)
        rows = rows.reshape(B, H_kv, g * Lq, D)
    else:
        rows = q.reshape(B, H_kv, g * Lq, D)
    rows_mask = {"block": lambda: mask.repeat(g, 1),
                 "by_row": lambda: mask.repeat_interleave(g, 0),
                 "as_is": lambda: mask, "none": lambda: None}[mask_rows]()
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=rows_mask,
                                         scale=scale)
    if not merge:
        return out
    if transpose:
        return out.reshape(B, H_kv, g, Lq, D).transpose(1, 2).reshape(
            B, H, Lq, D)
    return out.reshape(B, H, Lq, D)


def _shared_by_hand(q, k, v, mask):
    B, H, Lq, D = q.shape  # noqa: N806
    g = H // k.size(1)
    rows = q.reshape(B, k.size(1), g * Lq, D)
    scores = rows @ k.transpose(-2, -1) / D ** 0.5
    scores = scores.masked_fill(~mask.repeat(g, 1), float("-inf"))
    return (scores.softmax(-1) @ v).reshape(B, H, Lq, D)


RIGHT["check_shared_kv_attention"] = [lambda: (_shared,),
                                      lambda: (_shared_by_hand,)]
WRONG["check_shared_kv_attention"] = {
    "interleaved": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, transpose=True),),
    "no_merge": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, merge=False),),
    "unscaled": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, scale=1.0),),
    "copies": lambda: (lambda q, k, v, m: _shared(q, k, v, m, copy=True),),
    "no_mask": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, mask_rows="none"),),
    "mask_rows": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, mask_rows="by_row"),),
    "mask_shape": lambda: (
        lambda q, k, v, m: _shared(q, k, v, m, mask_rows="as_is"),),
}

# Exercise 14.5 (round 58): the copies the exercise forbids, each named.
# Exercise 14.2's own answer (unsqueeze, expand, reshape, as Hugging Face's
# repeat_kv) fed to SDPA; heads picked by number, k[:, torch.arange(H) // g];
# a broadcast matmul over a group axis, which expands K and V into a new
# tensor inside matmul. Tiling k.repeat(1, g, 1, 1) (heads 0, 1, 0, 1) has
# its own hint: the reader used no transpose.


def _shared_copied(q, k, v, mask, how):
    B, H, Lq, D = q.shape  # noqa: N806
    H_kv = k.size(1)  # noqa: N806
    g = H // H_kv
    if how == "expand":
        k, v = expand_kv(k, H), expand_kv(v, H)
    elif how == "index":
        heads = torch.arange(H) // g
        k, v = k[:, heads], v[:, heads]
    elif how == "tile":
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    if how != "broadcast":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rows = q.reshape(B, H_kv, g, Lq, D)
    scores = rows @ k[:, :, None].mT / D ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v[:, :, None]).reshape(B, H, Lq, D)


WRONG["check_shared_kv_attention"]["copies_expand"] = lambda: (
    lambda q, k, v, m: _shared_copied(q, k, v, m, "expand"),)
WRONG["check_shared_kv_attention"]["copies_index"] = lambda: (
    lambda q, k, v, m: _shared_copied(q, k, v, m, "index"),)
WRONG["check_shared_kv_attention"]["copies_broadcast"] = lambda: (
    lambda q, k, v, m: _shared_copied(q, k, v, m, "broadcast"),)
WRONG["check_shared_kv_attention"]["tiled"] = lambda: (
    lambda q, k, v, m: _shared_copied(q, k, v, m, "tile"),)
RIGHT["check_shared_kv_attention"].append(lambda: (
    lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=m, enable_gqa=True),))

# Exercise 14.2 (round 58): x returned unchanged is named by its shape;
# repeat_interleave on the batch axis (dim=0) gets a hint that names the
# axis and points back to the text.
WRONG["check_expand_kv"]["batch_axis"] = lambda: (
    lambda x, h: x.repeat_interleave(h // x.size(1), dim=0),)


def test_chapter14_expand_kv_unchanged_names_the_shape():
    verdict = _check("check_expand_kv", (lambda x, h: x,))
    assert not verdict and "(2, 2, 5, 3)" in verdict.message \
        and "(2, 4, 5, 3)" in verdict.message, verdict.message


def test_chapter14_shared_kv_with_enable_gqa_is_not_told_about_a_reshape():
    verdict = _check("check_shared_kv_attention", RIGHT[
        "check_shared_kv_attention"][-1]())
    assert verdict and "enable_gqa" in verdict.message, verdict.message

# Exercise 14.5 (round 62): a top-left mask, the classic alignment bug,
# named: the given mask ignored and rebuilt with tril (repeated to the
# stacked rows), or SDPA's is_causal=True on the stacked rows.


def _shared_top_left(q, k, v, mask, is_causal=False):
    B, H, Lq, D = q.shape  # noqa: N806
    g = H // k.size(1)
    rows = q.reshape(B, k.size(1), g * Lq, D)
    if is_causal:
        out = F.scaled_dot_product_attention(rows, k, v, is_causal=True)
    else:
        tril = torch.ones(Lq, k.size(2), dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(rows, k, v,
                                             attn_mask=tril.repeat(g, 1))
    return out.reshape(B, H, Lq, D)


WRONG["check_shared_kv_attention"]["top_left"] = lambda: (
    _shared_top_left,)
WRONG["check_shared_kv_attention"]["top_left/is_causal"] = lambda: (
    lambda q, k, v, m: _shared_top_left(q, k, v, m, is_causal=True),)

# --- chapter 14: round 64 ---
# Exercise 14.1, second half: the weights taken as the rounded 12.6 GiB the
# page prints (or 12.55), not the exact 2 x params bytes: under 1 % too few.

def _fits_rounded_weights(gib):
    return _fits(total=(80 - gib) * 2**30, divide=lambda a, b: int(a // b))


WRONG["check_cache_capacity"]["rounded_weights"] = lambda: (
    _fits_rounded_weights(12.6),)
WRONG["check_cache_capacity"]["rounded_weights/12.55"] = lambda: (
    _fits_rounded_weights(12.55),)

# --- chapter 17: more planted mistakes (round 56) ---
# Exercise 17.5: held lists only the slots written so far; a ring of W - 1
# slots is named as the read-then-write ring it is. Exercise 17.1: the
# document looked up at the batch index b, not at the query.

WRONG["check_ring_held"]["only_written"] = lambda: (
    lambda n, w: [t for t in _ring_held(n, w) if t >= 0],)


def _doc_window_by_b(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        same = document_id[b] == document_id[kv_idx]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def _doc_window_by_b_query(document_id, window):
    def mask_mod(b, h, q_idx, kv_idx):
        same = document_id[q_idx] == document_id[b]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


WRONG["check_document_window_mod"]["by_batch"] = lambda: (
    _doc_window_by_b,)
WRONG["check_document_window_mod"]["by_batch/query"] = lambda: (
    _doc_window_by_b_query,)


def test_chapter17_round56_ring_of_w_minus_one_says_read_then_write():
    verdict = _check("check_ring_held", WRONG["check_ring_held"][
        "w_minus_one_slots"]())
    assert not verdict and "read before" in verdict.message, verdict.message

# Exercise 17.6 (round 56): which inputs can change the last output of a
# stack of local and global layers.


def _reach(schedule, window, length, per_layer=None, layers=None,
           clamp=True, extra=0):
    if "global" in schedule and layers is None:
        return list(range(length))
    per_layer = window - 1 if per_layer is None else per_layer
    layers = len(schedule) if layers is None else layers
    first = length - 1 - layers * per_layer + extra
    return list(range(max(0, first) if clamp else first, length))


def _reach_tensor(schedule, window, length):
    local = all(kind == "local" for kind in schedule)
    back = len(schedule) * (window - 1) if local else length
    return torch.arange(length)[torch.arange(length) >= length - 1 - back]


RIGHT["check_reach_inputs"] = [lambda: (_reach,), lambda: (_reach_tensor,)]
WRONG["check_reach_inputs"] = {
    "section2": lambda: (lambda s, w, n: _reach(s, w, n, per_layer=w),),
    "one_layer": lambda: (lambda s, w, n: _reach(s, w, n, layers=1),),
    "global_as_local": lambda: (
        lambda s, w, n: _reach(s, w, n, layers=len(s)),),
    "global_skipped": lambda: (
        lambda s, w, n: _reach(s, w, n, layers=s.count("local")),),
    "one_too_few": lambda: (lambda s, w, n: _reach(s, w, n, extra=1),),
    "unclamped": lambda: (lambda s, w, n: _reach(s, w, n, clamp=False),),
}

# Round 62: an answer that starts at length - k W (W back per layer and
# the -1 of the last position dropped) is named, not just counted.
WRONG["check_reach_inputs"]["length_minus_kw"] = lambda: (
    lambda s, w, n: _reach(s, w, n, per_layer=w, extra=1),)

# --- chapter 17: round 64 ---
# Exercise 17.5: n - W to n - 1 in position order, unclamped ([-2, -1, 0, 1]
# at n = 2, W = 4). Exercise 17.3: a multiplicative decay of the score.
# Exercise 17.2: every other slope of the larger power of two (p slopes,
# not H), either half of them.
WRONG["check_ring_held"]["unclamped_in_order"] = lambda: (
    lambda n, w: list(range(n - w, n)),)
WRONG["check_bidirectional_alibi"]["multiplied"] = lambda: (
    lambda s: lambda score, b, h, q, kv: score * torch.exp(
        -s[h] * (q - kv).abs()),)


def _slopes_every_other_of_larger(num_heads, start=0):
    # Right for a power of two; otherwise every other slope of the next.
    larger = 2 ** math.ceil(math.log2(num_heads))
    slopes = [2.0 ** (-8 * (h + 1) / larger) for h in range(larger)]
    return slopes if larger == num_heads else slopes[start::2]


WRONG["check_alibi_slopes"]["every_other_larger"] = lambda: (
    _slopes_every_other_of_larger,)
WRONG["check_alibi_slopes"]["every_other_larger/odd"] = lambda: (
    lambda n: _slopes_every_other_of_larger(n, start=1),)


# --- chapter 18: more planted mistakes (round 56) ---
# Exercise 18.4: one einsum over the query, the latents and W_uk leaves
# the order of the products to einsum (it may rebuild the keys); the
# prompt asks for the absorption written out, so it is refused by name.
def _scores18_one_einsum(m, x):
    heads, d, r = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(x.size(1))
    q = mha_lib.split_heads(m.q_proj(x), heads)  # (B, H, L, D)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R)
    w = m.k_up.weight.view(heads, d, -1)  # (H, D, C)
    s = (torch.einsum("bhid,blc,hdc->bhil", q, m.kv_down(x), w)
         + torch.einsum("bhlr,bmr->bhlm", q_r, k_r))
    return s / (d + r) ** 0.5


WRONG["check_absorbed_scores"]["one_einsum"] = lambda: (
    _scores18_one_einsum,)


def test_chapter18_round56_one_einsum_is_named():
    verdict = _check("check_absorbed_scores",
                     WRONG["check_absorbed_scores"]["one_einsum"]())
    assert not verdict and "einsum" in verdict.message, verdict.message


# Exercise 18.6: one absorbed decoding step from the cached latents and
# rotary keys; the position offset, the append, the scale, a rotated
# latent and rebuilt keys or values are the planted mistakes.
def _step18(m, x, c, k_r, how=""):
    heads, pos = m.num_heads, torch.tensor([c.size(1)])
    if how == "position_zero":
        pos = torch.tensor([0])
    q = mha_lib.split_heads(m.q_proj(x), heads)  # (B, H, 1, D)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    if how != "not_appended":
        latent = m.kv_down(x)
        if how == "latent_rotated":
            latent = apply_rotary(latent, pos)
        c = torch.cat([c, latent], 1)
        k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))
    if how == "rebuilt_keys":
        k = mha_lib.split_heads(m.k_up(c), heads)  # (B, H, L + 1, D)
        s = q @ k.mT + q_r @ k_r[:, None].mT
    else:
        s = (q @ w_uk) @ c[:, None].mT + q_r @ k_r[:, None].mT
    width = m.head_dim if how == "scale_d" else m.head_dim + m.rope_dim
    w = (s / width ** 0.5).softmax(-1)  # (B, H, 1, L + 1)
    if how == "rebuilt_values":
        o = w @ mha_lib.split_heads(m.v_up(c), heads)
    else:
        o = (w @ c[:, None]) @ w_uv.mT  # (B, H, 1, D)
    return m.out_proj(mha_lib.merge_heads(o))


def _step18_einsum(m, x, c, k_r):
    heads, pos = m.num_heads, torch.tensor([c.size(1)])
    c = torch.cat([c, m.kv_down(x)], 1)
    k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    q = m.q_proj(x).unflatten(-1, (heads, -1))  # (B, 1, H, D)
    q_r = apply_rotary(
        m.q_rope_proj(x).unflatten(-1, (heads, -1)).transpose(1, 2), pos)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))
    latent_q = torch.einsum("bihd,hdc->bhic", q, w_uk)
    s = (torch.einsum("bhic,blc->bhil", latent_q, c)
         + torch.einsum("bhir,blr->bhil", q_r, k_r))
    w = (s / (m.head_dim + m.rope_dim) ** 0.5).softmax(-1)
    o = torch.einsum("bhil,blc,hdc->bihd", w, c, w_uv)
    return m.out_proj(o.flatten(2))


RIGHT["check_absorbed_step"] = [lambda: (_step18,),
                                lambda: (_step18_einsum,)]
WRONG["check_absorbed_step"] = {
    name: (lambda name=name: (
        lambda m, x, c, k_r: _step18(m, x, c, k_r, name),))
    for name in ("position_zero", "not_appended", "scale_d",
                 "rebuilt_keys", "rebuilt_values", "latent_rotated")}


# Exercise 18.2: the rotary key counted as R / 2 numbers (its rotation
# pairs) instead of R is named.
WRONG["check_latent_cache_bytes"]["half_rope"] = lambda: (
    lambda c, r, length, b, s: (c + r // 2) * length * b * s,)


def test_chapter18_round56_half_rope_is_named():
    verdict = _check("check_latent_cache_bytes",
                     WRONG["check_latent_cache_bytes"]["half_rope"]())
    assert not verdict and "pairs" in verdict.message, verdict.message


# Exercise 18.4: the rotary queries rotated at other positions than the
# shared rotary key (here reversed, L - 1 down to 0) is named.
def _scores18_flipped(m, x):
    heads, pos = m.num_heads, torch.arange(x.size(1))
    q = mha_lib.split_heads(m.q_proj(x), heads)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads),
                       pos.flip(0))
    k_r = apply_rotary(m.k_rope_proj(x), pos)
    latent_q = q @ m.k_up.weight.unflatten(0, (heads, -1))
    s = latent_q @ m.kv_down(x)[:, None].mT + q_r @ k_r[:, None].mT
    return s / (m.head_dim + m.rope_dim) ** 0.5


WRONG["check_absorbed_scores"]["positions_mismatch"] = lambda: (
    _scores18_flipped,)


def test_chapter18_round56_mismatched_positions_are_named():
    verdict = _check("check_absorbed_scores", WRONG[
        "check_absorbed_scores"]["positions_mismatch"]())
    assert not verdict and "same positions" in verdict.message, \
        verdict.message


# --- chapter 1: round 58 ---
# Exercise 1.3: two right merges, or a right fourth added, get a named hint
# (not only the count); a split with "</w>" inside the word is named.
# Exercise 1.6: Latin-1 with errors="replace" ("?" for the euro) is named.
WRONG["check_bpe_merges"].update({
    "count/short": lambda: ([("u", "g"), ("ug", "</w>")],),
    "count/long": lambda: ([("u", "g"), ("ug", "</w>"), ("b", "ug</w>"),
                            ("p", "ug</w>")],),
})
WRONG["check_bpe_split"]["marker_inside"] = lambda: (["b", "ug</w>", "s"],)
WRONG["check_byte_ids"]["latin1/replace"] = lambda: (
    lambda text: list(text.encode("latin-1", errors="replace")),)

# --- chapter 1: round 62 ---
# Exercise 1.3: the whole word "bugs" as one piece (with or without its
# "</w>") got the "bug is no piece" hint; no merge makes "bugs" at all.
WRONG["check_bpe_split"].update({
    "whole_word_unmade": lambda: (["bugs</w>"],),
    "whole_word_unmade/marker_apart": lambda: (["bugs", "</w>"],),
})

# --- chapter 1: round 72 ---
# Exercise 1.6: a list of one-byte bytes objects (the chapter's as_bytes
# pieces) for the ids is named, not called one list per character.
# Exercise 1.4: every pair of the batch, 144; each pad with all 24
# positions of the batch, 72; each pad with its 21 real tokens, 63.
WRONG["check_byte_ids"]["bytes_pieces"] = lambda: (
    lambda text: [bytes([b]) for b in text.encode("utf-8")],)

# --- chapter 1: round 76 ---
# Exercise 1.6: the text normalized to NFD (or NFKD) before encoding splits
# the i-diaeresis of "naive" into i and a combining mark: 7 bytes, not 6. The
# hint names normalization.
WRONG["check_byte_ids"].update({
    "nfd": lambda: (lambda text: list(
        unicodedata.normalize("NFD", text).encode("utf-8")),),
    "nfd/nfkd": lambda: (lambda text: list(
        unicodedata.normalize("NFKD", text).encode("utf-8")),),
})
WRONG["check_pad_scores"].update({
    "all_pairs": lambda: (144,),
    "batch_positions": lambda: (72,),
    "batch_real": lambda: (63,),
})


# --- chapter 12: the FFN added to x, ReLU and norm2 in the parallel block
# (round 58) ---
# Exercises 12.2 and Llama's block: the FFN's update added to x, not to h,
# drops attention's update. GPT-J's parallel block with F.relu in place of
# block.activation (GELU), or with norm2 for both sublayers. All three got
# the generic "entries are off"; each now has its own hint.
def _pre_norm_ffn_to_x(b, x, mask=None):
    h = x + b.attn(b.norm1(x), mask=mask, need_weights=False)[0]
    return x + b.linear2(b.activation(b.linear1(b.norm2(h))))


def _llama_ffn_to_x(p, x, causal=True):
    h = x + p.attn(p.norm1(x), need_weights=False, is_causal=causal)[0]
    z = p.norm2(h)
    return x + p.w2(F.silu(p.w1(z)) * p.w3(z))


def _parallel_ffn(b, x, causal=True, act=None, norm=None):
    z = (norm or b.norm1)(x)
    a = b.attn(z, need_weights=False, is_causal=causal)[0]
    return x + a + b.linear2((act or b.activation)(b.linear1(z)))


WRONG["check_pre_norm"]["ffn_to_x"] = lambda: (_pre_norm_ffn_to_x,)
WRONG["check_llama_block"].update({
    "ffn_to_x": lambda: (_llama_ffn_to_x,),
    "ffn_to_x/no_mask": lambda: (
        lambda p, x: _llama_ffn_to_x(p, x, causal=False),),
})
WRONG["check_parallel_block"].update({
    "fixed_relu": lambda: (
        lambda b, x: _parallel_ffn(b, x, act=F.relu),),
    "fixed_relu/no_mask": lambda: (
        lambda b, x: _parallel_ffn(b, x, causal=False, act=F.relu),),
    "norm2_both": lambda: (
        lambda b, x: _parallel_ffn(b, x, norm=b.norm2),),
    "norm2_both/no_mask": lambda: (
        lambda b, x: _parallel_ffn(b, x, causal=False, norm=b.norm2),),
})


# Exercise 18.6, round 58: the new token rotated one position early or
# late, the cached rotary keys rotated a second time, the scale over
# sqrt(C + R) and a missing out_proj are named (d_model = H * D in the
# checker's first layer, so the shape alone does not catch the last).
def _step18_more(m, x, c, k_r, how):
    heads, L = m.num_heads, c.size(1)
    pos = torch.tensor([L + {"previous": -1, "next": 1}.get(how, 0)])
    if how == "rerotated":
        k_r = apply_rotary(k_r, torch.arange(L))
    q = mha_lib.split_heads(m.q_proj(x), heads)  # (B, H, 1, D)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    c = torch.cat([c, m.kv_down(x)], 1)
    k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))
    s = (q @ w_uk) @ c[:, None].mT + q_r @ k_r[:, None].mT
    width = (m.kv_latent_dim + m.rope_dim if how == "scale_c_r"
             else m.head_dim + m.rope_dim)
    o = (s / width ** 0.5).softmax(-1) @ c[:, None] @ w_uv.mT
    o = mha_lib.merge_heads(o)  # (B, 1, H * D)
    return o if how == "no_out_proj" else m.out_proj(o)


for _name, _how in (("position_off_by_one/previous", "previous"),
                   ("position_off_by_one/next", "next"),
                   ("rerotated", "rerotated"), ("scale_c_r", "scale_c_r"),
                   ("no_out_proj", "no_out_proj")):
    WRONG["check_absorbed_step"][_name] = (
        lambda how=_how: (
            lambda m, x, c, k_r: _step18_more(m, x, c, k_r, how),))


# Exercise 18.6, round 64: keys and values rebuilt by hand from
# m.k_up.weight / m.v_up.weight (no call of the modules shows them), with
# @ or with F.linear, and values rebuilt by hand (weights applied before
# the weighted sum) are the explicit form and named as such.
def _step18_by_hand(m, x, c, k_r, how):
    heads, pos = m.num_heads, torch.tensor([c.size(1)])
    q = mha_lib.split_heads(m.q_proj(x), heads)  # (B, H, 1, D)
    q_r = apply_rotary(mha_lib.split_heads(m.q_rope_proj(x), heads), pos)
    c = torch.cat([c, m.kv_down(x)], 1)  # (B, L + 1, C)
    k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))
    if how == "values":  # keys absorbed, values rebuilt
        s = (q @ w_uk) @ c[:, None].mT + q_r @ k_r[:, None].mT
        v = c[:, None] @ w_uv.mT  # (B, H, L + 1, D)
    else:
        up = ((lambda t, w: F.linear(t, w)) if how == "linear"
              else (lambda t, w: t @ w.T))
        k = mha_lib.split_heads(up(c, m.k_up.weight), heads)
        v = mha_lib.split_heads(up(c, m.v_up.weight), heads)
        s = q @ k.mT + q_r @ k_r[:, None].mT
    w = (s / (m.head_dim + m.rope_dim) ** 0.5).softmax(-1)
    return m.out_proj(mha_lib.merge_heads(w @ v))


for _name, _how in (("rebuilt_keys/by_hand", "keys"),
                    ("rebuilt_keys/linear", "linear"),
                    ("rebuilt_values/by_hand", "values")):
    WRONG["check_absorbed_step"][_name] = (
        lambda how=_how: (
            lambda m, x, c, k_r: _step18_by_hand(m, x, c, k_r, how),))


def test_chapter18_round64_step_rebuilt_by_hand_is_named():
    for name in ("rebuilt_keys/by_hand", "rebuilt_keys/linear",
                 "rebuilt_values/by_hand"):
        verdict = _check("check_absorbed_step",
                         WRONG["check_absorbed_step"][name]())
        assert not verdict, (name, verdict.message)
        assert "by hand" in verdict.message, (name, verdict.message)

# Exercise 14.1 and 14.5 (round 68): the weights counted as params bytes
# (float16's 2 bytes a parameter forgotten); the queries stacked token by
# token (a transpose) while the mask is repeated as a block.
WRONG["check_cache_capacity"]["params_bytes"] = lambda: (
    _fits(total=80 * 2**30 - _PARAMS_7B),)


def _shared_stacked_by_token(q, k, v, mask):
    B, H, Lq, D = q.shape  # noqa: N806
    H_kv = k.size(1)  # noqa: N806
    g = H // H_kv
    rows = q.reshape(B, H_kv, g, Lq, D).transpose(2, 3).reshape(
        B, H_kv, Lq * g, D)  # token 0's g heads, then token 1's, ...
    out = F.scaled_dot_product_attention(rows, k, v,
                                         attn_mask=mask.repeat(g, 1))
    return out.reshape(B, H_kv, Lq, g, D).transpose(2, 3).reshape(
        B, H, Lq, D)


WRONG["check_shared_kv_attention"]["stacked_by_token"] = lambda: (
    _shared_stacked_by_token,)

# --- chapter 17: more planted mistakes (round 72) ---
# Exercise 17.2: the extra heads' slopes placed before the first p heads'.
# Exercise 17.3: slopes used without [h] (one score per head comes back for
# each score). Exercise 17.4: the capped score added to the score.


def _alibi_extra_first(n):
    p = 2 ** math.floor(math.log2(n))
    first = [2.0 ** (-8 * (h + 1) / p) for h in range(p)]
    twice = [2.0 ** (-8 * (h + 1) / (2 * p)) for h in range(2 * p)]
    return twice[0::2][:n - p] + first


WRONG["check_alibi_slopes"]["extra_first"] = lambda: (_alibi_extra_first,)
WRONG["check_bidirectional_alibi"]["unindexed"] = lambda: (
    lambda slopes: lambda s, b, h, q, kv: s - slopes * (q - kv).abs(),)
WRONG["check_softcap_score_mod"]["added"] = lambda: (
    lambda cap: lambda s, b, h, q, kv: s + cap * torch.tanh(s / cap),)


# --- chapter 14 (review 73): keys and values counted twice gets its own hint ---
WRONG["check_cache_bytes"]["doubled"] = lambda: (
    lambda n, h, d, length, b, s: 2 * 2 * n * h * d * length * b * s,)


# Exercise 18.6, round 76: the new token's rotary query left unrotated (its
# rotary key rotated at L as it should be) is named, as in exercise 18.4.
def _step18_query_unrotated(m, x, c, k_r):
    heads, pos = m.num_heads, torch.tensor([c.size(1)])
    q = mha_lib.split_heads(m.q_proj(x), heads)  # (B, H, 1, D)
    q_r = mha_lib.split_heads(m.q_rope_proj(x), heads)  # not rotated
    c = torch.cat([c, m.kv_down(x)], 1)
    k_r = torch.cat([k_r, apply_rotary(m.k_rope_proj(x), pos)], 1)
    w_uk = m.k_up.weight.unflatten(0, (heads, -1))  # (H, D, C)
    w_uv = m.v_up.weight.unflatten(0, (heads, -1))
    s = (q @ w_uk) @ c[:, None].mT + q_r @ k_r[:, None].mT
    w = (s / (m.head_dim + m.rope_dim) ** 0.5).softmax(-1)
    o = (w @ c[:, None]) @ w_uv.mT  # (B, H, 1, D)
    return m.out_proj(mha_lib.merge_heads(o))


WRONG["check_absorbed_step"]["query_not_rotated"] = lambda: (
    _step18_query_unrotated,)


def test_chapter18_round76_step_query_not_rotated_is_named():
    verdict = _check("check_absorbed_step",
                     WRONG["check_absorbed_step"]["query_not_rotated"]())
    assert not verdict and "rotary query" in verdict.message, verdict.message
    assert "Positions need their own key" in verdict.message or \
        "Decoding with a latent cache" in verdict.message, verdict.message


# --- chapter 1: round 78 ---
# Exercise 1.5: each merge scanned from the word's end; Exercise 1.4: the
# count doubled (54); Exercise 1.2: a vocabulary that keeps the capitals;
# Exercise 1.6: the text normalized to NFKC (the ligature fi of "fine").
def _right_to_left78(word, merges):  # scans each merge from the end
    symbols = [*word, "</w>"]
    for a, b in merges:
        out, i = [], len(symbols) - 1
        while i >= 0:
            if i > 0 and (symbols[i - 1], symbols[i]) == (a, b):
                out.append(a + b)
                i -= 2
            else:
                out.append(symbols[i])
                i -= 1
        symbols = out[::-1]
    return symbols


def _vocab_capitals78():  # split on spaces, no lowercasing
    words = {w.strip("!.?") for s in SENTENCES for w in s.split(" ")}
    return {w: i for i, w in enumerate(["<pad>", *sorted(words)])}


WRONG["check_bpe_split"]["right_to_left"] = lambda: (_right_to_left78,)
WRONG["check_pad_scores"]["doubled"] = lambda: (54,)
WRONG["check_vocab"]["not_lowercased"] = lambda: (_vocab_capitals78(),)
WRONG["check_byte_ids"]["nfkc"] = lambda: (
    lambda t: list(unicodedata.normalize("NFKC", t).encode("utf-8")),)


def test_chapter1_round78_split_hint_says_one_merge():
    verdict = _check("check_bpe_split", (_right_to_left78,))
    assert "'aaa', 1 merge)" in verdict.message, verdict.message


# Exercise 14.5 (round 78): q transposed to (B, Lq, H, D) before the reshape
# to (B, H_kv, g * Lq, D), so a group's rows mix tokens and heads; the
# result reshaped back the same way. A reviewer's answer that got only the
# generic values message.


def _shared_transposed_first(q, k, v, mask):
    B, H, Lq, D = q.shape  # noqa: N806
    g = H // k.size(1)
    rows = q.transpose(1, 2).reshape(B, k.size(1), g * Lq, D)
    out = F.scaled_dot_product_attention(rows, k, v,
                                         attn_mask=mask.repeat(g, 1))
    return out.reshape(B, Lq, H, D).transpose(1, 2)


WRONG["check_shared_kv_attention"]["transposed_first"] = lambda: (
    _shared_transposed_first,)
