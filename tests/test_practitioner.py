"""MultiHeadAttention (and RotaryAttention, MultiHeadLatentAttention, TransformerBlock and
TinyTransformer, in the second half) as practitioners use them: hooks, LoRA, subclassed,
quantized, pruned and reparametrized layers; autocast; torch.compile(fullgraph=True) and
torch.export.

The module's contract: both paths (``need_weights=True``, the explicit one, and ``False``,
on ``F.scaled_dot_product_attention``) call its own layers, ``self.q_proj(x)`` and so on,
and take dropout from its ``nn.Dropout``. So for every change made to a layer below:

* the explicit and the fused outputs agree;
* both reflect the change: they equal an independent computation with the changed layers
  (``by_hand``, written here from the formula) and differ from the unchanged module.

A module that read ``q_proj.weight`` instead of calling ``q_proj`` fails most of these
(tried: a fused path on ``F.linear(x, layer.weight, layer.bias)`` fails 24 of them; latent
attention's absorbed form reading ``k_up.weight`` and ``v_up.weight`` fails 26).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize
import torch.nn.utils.prune
from torch import nn
from torch.testing import assert_close

from mha_lib import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    RotaryAttention,
    TinyTransformer,
    TransformerBlock,
    causal_mask,
)

param = pytest.mark.parametrize
TOL = dict(atol=2e-5, rtol=2e-5)
SIZES = {"small": (2, 5, 16), "large": (2, 384, 64)}  # (B, L, d_model)
KINDS = {
    "mha": lambda d: MultiHeadAttention(d, 4),
    "gqa": lambda d: GroupedQueryAttention(d, 4, num_kv_heads=2),
}


def by_hand(m: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None = None
            ) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V per head, from the module's layers called on x; key/value
    head h // (H / H_kv) for query head h. Written from the formula, not from mha_lib."""
    batch, length, _ = x.shape
    heads, kv_heads, head_dim = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
    k = m.k_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    v = m.v_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    index = torch.arange(heads) // (heads // kv_heads)
    k, v = k[:, index], v[:, index]  # (B, H, L, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)
    return m.out_proj(out.transpose(1, 2).reshape(batch, length, heads * head_dim))


# ---------------------------------------------------------------------------------------------
# The changes a practitioner makes to the linear layers
# ---------------------------------------------------------------------------------------------


class LoRA(nn.Module):
    """A low-rank adapter around a frozen linear layer: base(x) + scale * B(A(x))."""

    def __init__(self, base: nn.Linear, rank: int = 2, expose_weight: bool = True):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.up.weight, std=0.5)  # nonzero, so the adapter changes the output
        self.scale = 0.7
        if expose_weight:  # some wrappers re-export the frozen weight, some do not
            self.weight = base.weight
            self.bias = base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * self.up(self.down(x))


class ScaledLinear(nn.Linear):
    """An nn.Linear subclass with its own forward (a shift alone would cancel in the
    softmax, so it scales too)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.5 * super().forward(x) + 0.25


class Halve(nn.Module):
    """A parametrization: the layer's weight is used halved."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / 2


def _forward_hook(m):
    m.q_proj.register_forward_hook(lambda layer, args, out: out * 2)
    m.out_proj.register_forward_hook(lambda layer, args, out: out - 1)


def _pre_hook(m):
    m.v_proj.register_forward_pre_hook(lambda layer, args: (args[0].flip(-1),))


def _lora(expose_weight):
    def change(m):
        for name in ("q_proj", "v_proj"):
            setattr(m, name, LoRA(getattr(m, name), expose_weight=expose_weight))
    return change


def _subclass(m):
    shifted = ScaledLinear(m.k_proj.in_features, m.k_proj.out_features)
    shifted.load_state_dict(m.k_proj.state_dict())
    m.k_proj = shifted


def _prune(m):
    for layer in (m.q_proj, m.out_proj):
        torch.nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)


def _spectral_norm(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the hook-based version is deprecated
        torch.nn.utils.spectral_norm(m.k_proj)


def _parametrize(m):
    torch.nn.utils.parametrize.register_parametrization(m.q_proj, "weight", Halve())


CHANGES = {
    "forward_hook": _forward_hook,
    "forward_pre_hook": _pre_hook,
    "lora_with_weight": _lora(True),
    "lora_without_weight": _lora(False),
    "linear_subclass": _subclass,
    "prune": _prune,
    "spectral_norm": _spectral_norm,
    "parametrize": _parametrize,
}


@param("size", list(SIZES))
@param("kind", list(KINDS))
@param("change", list(CHANGES))
def test_both_paths_call_the_changed_layers(change, kind, size):
    batch, length, d_model = SIZES[size]
    torch.manual_seed(0)
    plain = KINDS[kind](d_model).eval()
    m = copy.deepcopy(plain)
    CHANGES[change](m)
    x = torch.randn(batch, length, d_model)
    mask = causal_mask(length)
    with torch.no_grad():
        explicit, _ = m(x, mask=mask)
        fused, _ = m(x, mask=mask, need_weights=False)
        expected = by_hand(m, x, mask)
        before, _ = plain(x, mask=mask)
    assert_close(explicit, expected, **TOL)
    assert_close(fused, expected, **TOL)
    assert (expected - before).abs().max() > 1e-2, "the change did not change the output"


@param("kind", list(KINDS))
def test_hooks_fire_once_per_call_on_both_paths(kind):
    m = KINDS[kind](16)
    calls = []
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(m, name).register_forward_hook(lambda layer, a, o, name=name: calls.append(name))
    x = torch.randn(2, 3, 16)
    for need_weights in (True, False):
        calls.clear()
        m(x, need_weights=need_weights)
        assert calls == ["q_proj", "k_proj", "v_proj", "out_proj"], need_weights


@param("size", list(SIZES))
def test_quantize_dynamic(size):
    batch, length, d_model = SIZES[size]
    torch.manual_seed(1)
    plain = MultiHeadAttention(d_model, 4).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        m = torch.ao.quantization.quantize_dynamic(copy.deepcopy(plain), {nn.Linear},
                                                   dtype=torch.qint8)
    assert not isinstance(m.q_proj, nn.Linear) or type(m.q_proj) is not nn.Linear
    x = torch.randn(batch, length, d_model)
    with torch.no_grad():
        explicit, _ = m(x, is_causal=True)
        fused, _ = m(x, is_causal=True, need_weights=False)
        expected = by_hand(m, x, causal_mask(length))
        before, _ = plain(x, is_causal=True)
    assert_close(explicit, expected, **TOL)
    assert_close(fused, expected, **TOL)
    assert 0 < (expected - before).abs().max() < 0.1  # int8 rounding, nothing more


def test_dropout_comes_from_the_dropout_module():
    torch.manual_seed(2)
    m = MultiHeadAttention(16, 4, dropout=0.0).train()
    x = torch.randn(2, 6, 16)
    eval_out, _ = copy.deepcopy(m).eval()(x, need_weights=False)
    assert_close(m(x, need_weights=False)[0], eval_out)  # p = 0: no dropout
    m.attn_dropout.p = 0.5  # changed on the module: both paths and `dropout` follow
    assert m.dropout == 0.5
    for need_weights in (True, False):
        torch.manual_seed(3)
        dropped, _ = m(x, need_weights=need_weights)
        assert (dropped - eval_out).abs().max() > 1e-2, need_weights
    m.attn_dropout.eval()  # the dropout module's own mode counts, on both paths
    for need_weights in (True, False):
        assert_close(m(x, need_weights=need_weights)[0], eval_out)
    m.dropout = 0.25
    assert m.attn_dropout.p == 0.25
    m.attn_dropout = nn.Identity()
    with pytest.raises(TypeError, match="attn_dropout: .* needs an nn.Dropout, got Identity"):
        m(x, need_weights=False)


@param("mask_kind", ["none", "bool", "float"])
def test_autocast_runs_both_paths(mask_kind):
    torch.manual_seed(4)
    m = GroupedQueryAttention(32, 4, 2).eval()
    x = torch.randn(2, 7, 32)
    mask = {"none": None, "bool": causal_mask(7),
            "float": torch.zeros(7, 7).masked_fill(~causal_mask(7), float("-inf"))}[mask_kind]
    reference, _ = m(x, mask=mask)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        explicit, weights = m(x, mask=mask)
        fused, _ = m(x, mask=mask, need_weights=False)
    assert explicit.dtype == fused.dtype == torch.bfloat16
    assert_close(explicit.float(), reference, atol=0.05, rtol=0.05)
    assert_close(fused.float(), reference, atol=0.05, rtol=0.05)


# ---------------------------------------------------------------------------------------------
# Graph capture: torch.compile(fullgraph=True) and torch.export
# ---------------------------------------------------------------------------------------------

MASKS = {
    "no_mask": lambda n: None,
    "bool": lambda n: causal_mask(n),
    "float": lambda n: torch.zeros(n, n).masked_fill(~causal_mask(n), float("-inf")),
}


class _Attend(nn.Module):
    """forward(x, mask) -> output, for torch.export (which wants a module)."""

    def __init__(self, attention: nn.Module, need_weights: bool):
        super().__init__()
        self.attention, self.need_weights = attention, need_weights

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.attention(x, mask=mask, need_weights=self.need_weights)[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()  # test isolation only; mha_lib itself uses no private API


@param("need_weights", [True, False])
@param("mask_kind", list(MASKS))
@param("kind", list(KINDS))
def test_compile_fullgraph_matches_eager(kind, mask_kind, need_weights):
    """fullgraph=True fails on any graph break, such as reading a tensor's values for an
    input check (the float mask's 0/1 check is skipped while tracing)."""
    torch.manual_seed(5)
    model = _Attend(KINDS[kind](16).eval(), need_weights)
    x, mask = torch.randn(2, 6, 16), MASKS[mask_kind](6)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with _float_mask_warning(mask_kind):
        assert_close(compiled(x, mask), model(x, mask))


def _float_mask_warning(mask_kind: str):
    """Compiling or exporting with a float mask warns that its values go unchecked."""
    if mask_kind == "float":
        return pytest.warns(UserWarning, match="mask: a float mask is added")
    return warnings.catch_warnings()


@param("mask_kind", list(MASKS))
@param("kind", list(KINDS))
def test_export_matches_eager(kind, mask_kind):
    torch.manual_seed(6)
    model = _Attend(KINDS[kind](16).eval(), need_weights=False)
    x, mask = torch.randn(2, 6, 16), MASKS[mask_kind](6)
    args = (x,) if mask is None else (x, mask)
    with _float_mask_warning(mask_kind):
        exported = torch.export.export(model, args)
    assert_close(exported.module()(*args), model(*args))


# TinyTransformer under torch.compile and torch.export:
# test_compile_fullgraph_and_export_every_module[tiny] below.


def test_compiled_with_inductor_matches_eager():
    """One real compilation (inductor, C++ code generation) of the fused causal path."""
    torch.manual_seed(8)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 10, 32)
    compiled = torch.compile(lambda t: m(t, is_causal=True, need_weights=False)[0],
                             fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(x), m(x, is_causal=True)[0], **TOL)


def test_value_check_still_runs_in_eager_mode():
    m = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="only 0s and 1s"):
        m(torch.randn(2, 6, 16), mask=causal_mask(6).float())


@param("need_weights", [True, False])
def test_compiled_and_exported_calls_say_the_float_mask_is_not_value_checked(need_weights):
    """Eager refuses a float 0/1 mask; a compiler cannot read its values, so a compiled or
    exported call adds it as given: never silently, a UserWarning says so while tracing."""
    torch.manual_seed(11)
    model = _Attend(MultiHeadAttention(16, 4).eval(), need_weights)
    x, keep = torch.randn(2, 6, 16), causal_mask(6).float()  # 1 = keep: the mistake
    with pytest.raises(ValueError, match="only 0s and 1s"):
        model(x, keep)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.warns(UserWarning, match=r"mask: a float mask is added .* torch\.compile"):
        compiled(x, keep)
    with pytest.warns(UserWarning, match=r"mask: a float mask is added .* torch\.export"):
        torch.export.export(model, (x, keep))
    with warnings.catch_warnings():  # a bool mask: nothing to say
        warnings.simplefilter("error")
        torch._dynamo.reset()
        torch.compile(model, fullgraph=True, backend="aot_eager")(x, causal_mask(6))


@param("need_weights", [True, False])
def test_vmap_over_per_sample_float_masks(need_weights):
    """vmap cannot read a value either: a float mask per sample is added (with the same
    warning), and each sample gets what a call of its own gives."""
    torch.manual_seed(12)
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(3, 1, 5, 16)
    masks = torch.randn(3, 5, 5).masked_fill(~causal_mask(5), float("-inf"))
    with pytest.warns(UserWarning, match=r"mask: .* torch\.func\.vmap"):
        out = torch.func.vmap(lambda t, mk: m(t, mask=mk, need_weights=need_weights)[0])(
            x, masks)
    for i in range(3):
        assert_close(out[i], m(x[i], mask=masks[i], need_weights=need_weights)[0], **TOL)


# ---------------------------------------------------------------------------------------------
# Caches and masks: no silent misuse
# ---------------------------------------------------------------------------------------------


def test_cached_decode_with_hooks_matches_full_forward():
    """The cache path calls the layers too: a hooked model decodes as it runs in full."""
    torch.manual_seed(9)
    m = MultiHeadAttention(16, 4).eval()
    _forward_hook(m)
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        full, _ = m(x, is_causal=True, need_weights=False)
        cache = KVCache()
        steps = [m(x[:, :3], is_causal=True, cache=cache, need_weights=False)[0]]
        steps += [m(x[:, t:t + 1], cache=cache, need_weights=False)[0] for t in range(3, 8)]
    assert_close(torch.cat(steps, dim=1), full, **TOL)


@param("need_weights", [True, False])
def test_three_d_masks_are_refused_on_both_paths(need_weights):
    """(B, Lq, Lk) with B == H would otherwise be read as (H, Lq, Lk)."""
    m = MultiHeadAttention(16, 4)
    x = torch.randn(4, 5, 16)  # B = H = 4
    with pytest.raises(ValueError, match=r"mask\[:, None\]"):
        m(x, mask=torch.ones(4, 5, 5, dtype=torch.bool), need_weights=need_weights)
    for shape in [(5,), ()]:
        with pytest.raises(ValueError, match=r"mask: expected shape \(Lq, Lk\)"):
            m(x, mask=torch.ones(shape, dtype=torch.bool), need_weights=need_weights)


def test_sdpa_reference_agrees_with_by_hand():
    """The reference itself, against PyTorch's kernel (so a wrong by_hand cannot pass)."""
    torch.manual_seed(10)
    m = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    q = m.q_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    k = m.k_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    v = m.v_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = m.out_proj(out.transpose(1, 2).reshape(2, 5, 16))
    assert_close(by_hand(m, x, causal_mask(5)), expected, **TOL)


# ---------------------------------------------------------------------------------------------
# The other modules: RotaryAttention, MultiHeadLatentAttention (both forms), TransformerBlock,
# TinyTransformer. Each change acts on two of the module's layers, named by path.
# ---------------------------------------------------------------------------------------------


def rotate_half_by_hand(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary positions 0, 1, ... of x (..., L, D), "rotate half" layout, written as
    x cos + rotate_half(x) sin (Hugging Face's Llama), in float64."""
    length, dim = x.shape[-2:]
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq  # (L, D/2)
    emb = torch.cat([angles, angles], dim=-1)  # (L, D)
    half = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], dim=-1).double()
    return (x.double() * emb.cos() + half * emb.sin()).to(x.dtype)


def rotary_by_hand(m: RotaryAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """by_hand with queries and keys rotated after the split into heads."""
    batch, length, _ = x.shape
    heads, kv_heads, head_dim = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
    k = m.k_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    v = m.v_proj(x).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    q, k = rotate_half_by_hand(q, m.base), rotate_half_by_hand(k, m.base)
    index = torch.arange(heads) // (heads // kv_heads)
    scores = q @ k[:, index].transpose(-2, -1) / math.sqrt(head_dim)
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v[:, index]
    return m.out_proj(out.transpose(1, 2).reshape(batch, length, heads * head_dim))


def latent_by_hand(m: MultiHeadLatentAttention, x: torch.Tensor, mask: torch.Tensor
                   ) -> torch.Tensor:
    """DeepSeek-V2's equations with every layer called on the tokens (keys and values
    rebuilt from the latents), whatever the module's `absorb`."""
    batch, length, _ = x.shape
    heads, head_dim, rope = m.num_heads, m.head_dim, m.rope_dim
    c = m.kv_down(x)  # (B, L, C)
    k_c = m.k_up(c).view(batch, length, heads, head_dim).transpose(1, 2)
    v_c = m.v_up(c).view(batch, length, heads, head_dim).transpose(1, 2)
    k_r = rotate_half_by_hand(m.k_rope_proj(x)[:, None], m.base)  # (B, 1, L, R)
    q_c = m.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
    q_r = rotate_half_by_hand(
        m.q_rope_proj(x).view(batch, length, heads, rope).transpose(1, 2), m.base)
    scores = (q_c @ k_c.transpose(-2, -1) + q_r @ k_r.transpose(-2, -1)) \
        / math.sqrt(head_dim + rope)
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v_c
    return m.out_proj(out.transpose(1, 2).reshape(batch, length, heads * head_dim))


def block_by_hand(block: TransformerBlock, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pre-norm: x + attn(LN1(x)), then + linear2(act(linear1(LN2(x))))."""
    x = x + by_hand(block.attn, block.norm1(x), mask)
    return x + block.linear2(block.activation(block.linear1(block.norm2(x))))


def tiny_by_hand(model: TinyTransformer, idx: torch.Tensor) -> torch.Tensor:
    """Embeddings, the blocks with a causal mask, the final LayerNorm and the head."""
    length = idx.size(1)
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(length))
    for block in model.blocks:
        x = block_by_hand(block, x, causal_mask(length))
    return model.head(model.ln_f(x))


def _run(kind: str, m: nn.Module, x: torch.Tensor, **path) -> torch.Tensor:
    """The module's causal output on one path: need_weights (and absorb for latent)."""
    if kind == "tiny":
        return m(x, need_weights=path["need_weights"])[0] if path["need_weights"] else m(x)
    return m(x, is_causal=True, **path)[0]


class Kind:
    """A module kind: how to make one, its independent reference, its input, the two
    layers a change acts on, and the keyword sets of its paths."""

    def __init__(self, make, reference, inputs, targets, paths):
        self.make, self.reference, self.inputs = make, reference, inputs
        self.targets, self.paths = targets, paths


NEED = [{"need_weights": True}, {"need_weights": False}]
ABSORB = [{"need_weights": w, "absorb": a} for w in (True, False) for a in (False, True)]
MORE_KINDS = {
    "rotary": Kind(lambda: RotaryAttention(16, 4, 2), rotary_by_hand,
                   lambda: torch.randn(2, 5, 16), ("q_proj", "v_proj"), NEED),
    "latent": Kind(lambda: MultiHeadLatentAttention(16, 4, 6, 4, bias=True), latent_by_hand,
                   lambda: torch.randn(2, 5, 16), ("k_up", "v_up"), ABSORB),
    "latent_large": Kind(lambda: MultiHeadLatentAttention(64, 4, 24, 8), latent_by_hand,
                         lambda: torch.randn(2, 96, 64), ("k_up", "v_up"), ABSORB),
    "block": Kind(lambda: TransformerBlock(16, 4, 32), block_by_hand,
                  lambda: torch.randn(2, 5, 16), ("attn.q_proj", "linear1"), NEED),
    "tiny": Kind(lambda: TinyTransformer(11, 16, 4, 2, max_len=8, num_kv_heads=2),
                 lambda m, idx, mask: tiny_by_hand(m, idx), lambda: torch.randint(11, (2, 5)),
                 ("blocks.1.attn.k_proj", "head"), NEED),
}


def _get(m: nn.Module, path: str) -> nn.Module:
    return m.get_submodule(path)


def _set(m: nn.Module, path: str, layer: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(m.get_submodule(parent), name, layer)


def _hooks_at(m, first, second):
    _get(m, first).register_forward_hook(lambda layer, args, out: out * 2)
    _get(m, second).register_forward_hook(lambda layer, args, out: out - 1)


def _pre_hook_at(m, first, second):
    _get(m, second).register_forward_pre_hook(lambda layer, args: (args[0].flip(-1),))


def _lora_at(expose_weight):
    def change(m, first, second):
        for path in (first, second):
            _set(m, path, LoRA(_get(m, path), expose_weight=expose_weight))
    return change


def _subclass_at(m, first, second):
    old = _get(m, first)
    new = ScaledLinear(old.in_features, old.out_features, bias=old.bias is not None)
    new.load_state_dict(old.state_dict())
    _set(m, first, new)


def _prune_at(m, first, second):
    for path in (first, second):
        torch.nn.utils.prune.l1_unstructured(_get(m, path), "weight", amount=0.5)


def _spectral_norm_at(m, first, second):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.spectral_norm(_get(m, first))


def _parametrize_at(m, first, second):
    torch.nn.utils.parametrize.register_parametrization(_get(m, first), "weight", Halve())


CHANGES_AT = {
    "forward_hook": _hooks_at,
    "forward_pre_hook": _pre_hook_at,
    "lora_with_weight": _lora_at(True),
    "lora_without_weight": _lora_at(False),
    "linear_subclass": _subclass_at,
    "prune": _prune_at,
    "spectral_norm": _spectral_norm_at,
    "parametrize": _parametrize_at,
}


@param("change", list(CHANGES_AT))
@param("kind", list(MORE_KINDS))
def test_every_module_calls_its_changed_layers(kind, change):
    """Every path (and both forms of latent attention) equals the independent reference
    computed with the changed layers, which differs from the unchanged module."""
    spec = MORE_KINDS[kind]
    torch.manual_seed(13)
    plain = spec.make().eval()
    m = copy.deepcopy(plain)
    CHANGES_AT[change](m, *spec.targets)
    x = spec.inputs()
    with torch.no_grad():
        expected = spec.reference(m, x, causal_mask(x.size(1)))
        before = _run(kind, plain, x, **spec.paths[0])
        for path in spec.paths:
            assert_close(_run(kind, m, x, **path), expected, **TOL, msg=str(path))
    assert (expected - before).abs().max() > 1e-2, "the change did not change the output"


def test_references_agree_with_the_plain_modules():
    """The references themselves, on unchanged modules, against the modules' default path."""
    for kind, spec in MORE_KINDS.items():
        torch.manual_seed(14)
        m, x = spec.make().eval(), spec.inputs()
        with torch.no_grad():
            assert_close(spec.reference(m, x, causal_mask(x.size(1))),
                         _run(kind, m, x, **spec.paths[0]), **TOL, msg=kind)


LAYERS = {
    "rotary": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "latent": ["q_proj", "q_rope_proj", "kv_down", "k_rope_proj", "k_up", "v_up", "out_proj"],
    "block": ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "linear1",
              "linear2", "norm1", "norm2"],
    "tiny": ["tok_emb", "pos_emb", "blocks.0.attn.q_proj", "blocks.0.linear2",
             "blocks.1.attn.v_proj", "ln_f", "head"],
}


@param("kind", list(LAYERS))
def test_hooks_fire_once_per_call_on_every_path(kind):
    spec = MORE_KINDS[kind]
    m, x = spec.make().eval(), spec.inputs()
    calls = []
    for name in LAYERS[kind]:
        _get(m, name).register_forward_hook(lambda layer, a, o, name=name: calls.append(name))
    for path in spec.paths:
        calls.clear()
        _run(kind, m, x, **path)
        assert sorted(calls) == sorted(LAYERS[kind]), path


@param("kind", list(LAYERS))
def test_quantize_dynamic_every_module(kind):
    """int8 layers: every path equals the reference with the quantized layers called on the
    tokens, except the absorbed form, which calls k_up and v_up on the basis vectors and
    so quantizes other activations (int8 rounding apart, the same)."""
    spec = MORE_KINDS[kind]
    torch.manual_seed(15)
    plain = spec.make().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = torch.ao.quantization.quantize_dynamic(copy.deepcopy(plain), {nn.Linear},
                                                   dtype=torch.qint8)
    x = spec.inputs()
    with torch.no_grad():
        expected = spec.reference(m, x, causal_mask(x.size(1)))
        before = _run(kind, plain, x, **spec.paths[0])
        for path in spec.paths:
            close = dict(atol=0.05, rtol=0.05) if path.get("absorb") else TOL
            assert_close(_run(kind, m, x, **path), expected, **close, msg=str(path))
    assert 0 < (expected - before).abs().max() < 0.2  # int8 rounding, nothing more


@param("kind", list(LAYERS))
def test_autocast_every_module(kind):
    spec = MORE_KINDS[kind]
    torch.manual_seed(16)
    m, x = spec.make().eval(), spec.inputs()
    reference = _run(kind, m, x, **spec.paths[0])
    # A block adds its layers' bfloat16 outputs to the float32 input (the residual stream)
    dtype = torch.float32 if kind == "block" else torch.bfloat16
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for path in spec.paths:
            out = _run(kind, m, x, **path)
            assert out.dtype == dtype, path
            assert_close(out.float(), reference, atol=0.1, rtol=0.05, msg=str(path))
            assert not torch.equal(out.float(), reference), "autocast changed nothing"


class _Causal(nn.Module):
    """forward(x) -> the module's causal output on one path, for torch.export."""

    def __init__(self, kind: str, module: nn.Module, path: dict):
        super().__init__()
        self.kind, self.module, self.path = kind, module, path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _run(self.kind, self.module, x, **self.path)


@param("kind", list(LAYERS))
def test_compile_fullgraph_and_export_every_module(kind):
    spec = MORE_KINDS[kind]
    torch.manual_seed(17)
    m, x = spec.make().eval(), spec.inputs()
    for path in spec.paths:
        model = _Causal(kind, m, path)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert_close(compiled(x), model(x), **TOL, msg=str(path))
        assert_close(torch.export.export(model, (x,)).module()(x), model(x), **TOL,
                     msg=str(path))
        torch._dynamo.reset()
