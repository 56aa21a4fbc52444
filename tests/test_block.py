"""TransformerBlock against the reference, torch.nn.TransformerEncoderLayer(batch_first=True):
same values and gradients for pre- and post-norm, relu and gelu, with and without masks
(the layer's bool masks mean True = blocked); exact round trips; what one side has and the
other has not is refused. Then the block's own properties, and TinyTransformer built from it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import mha_lib
from mha_lib import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    TinyTransformer,
    TransformerBlock,
    causal_mask,
    from_torch_encoder_layer,
    padding_mask,
    to_torch_encoder_layer,
)

param = pytest.mark.parametrize
TOL = dict(atol=1e-5, rtol=1e-5)
B, L, D, H, D_FF = 3, 6, 8, 4, 32
LENGTHS = torch.tensor([6, 4, 1])


def _block(norm_first=True, activation="gelu", dropout=0.0, seed=0, **kw):
    torch.manual_seed(seed)
    block = TransformerBlock(D, H, D_FF, dropout, norm_first, activation, **kw)
    with torch.no_grad():  # LayerNorm starts at weight 1, bias 0: make it matter
        for norm in (block.norm1, block.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return block


def _x(seed=1, batch=B, length=L):
    return torch.randn(batch, length, D, generator=torch.Generator().manual_seed(seed))


# The same masking four ways: (mha_lib mask, nn.TransformerEncoderLayer keyword arguments).
def _masks(name):
    valid = padding_mask(LENGTHS, L)  # (B, 1, 1, L), True = may attend
    causal = causal_mask(L)  # (L, L), True = may attend
    if name == "none":
        return None, {}
    if name == "causal":
        return causal, {"src_mask": ~causal}
    if name == "padding":
        return valid, {"src_key_padding_mask": ~valid[:, 0, 0]}
    if name == "padding & causal":
        return valid & causal, {"src_key_padding_mask": ~valid[:, 0, 0], "src_mask": ~causal}
    if name == "float":
        bias = torch.randn(L, L, generator=torch.Generator().manual_seed(7))
        bias = bias.masked_fill(~causal, float("-inf"))
        return bias, {"src_mask": bias}
    raise ValueError(name)


MASKS = ["none", "causal", "padding", "padding & causal", "float"]


def _torch_grads(layer):
    """The layer's parameter gradients under the block's names."""
    attn = layer.self_attn
    w = attn.in_proj_weight.grad.chunk(3)
    b = attn.in_proj_bias.grad.chunk(3)
    grads = {f"attn.{p}_proj.weight": g for p, g in zip("qkv", w, strict=True)}
    grads |= {f"attn.{p}_proj.bias": g for p, g in zip("qkv", b, strict=True)}
    grads |= {"attn.out_proj.weight": attn.out_proj.weight.grad,
              "attn.out_proj.bias": attn.out_proj.bias.grad}
    for name in ("linear1", "linear2", "norm1", "norm2"):
        for kind in ("weight", "bias"):
            grads[f"{name}.{kind}"] = getattr(getattr(layer, name), kind).grad
    return grads


@param("norm_first", [True, False], ids=["pre-norm", "post-norm"])
@param("activation", ["relu", "gelu"])
@param("mask_name", MASKS)
def test_values_and_gradients_match_torch(norm_first, activation, mask_name):
    block = _block(norm_first, activation)
    layer = to_torch_encoder_layer(block)
    mask, torch_masks = _masks(mask_name)
    x1 = _x().requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    out, weights = block(x1, mask=mask)
    expected = layer(x2, **torch_masks)
    assert weights is None
    assert_close(out, expected, **TOL)
    # A loss that weighs every output differently, so no gradient cancels out.
    w = torch.randn(B, L, D, generator=torch.Generator().manual_seed(3))
    (out * w).sum().backward()
    (expected * w).sum().backward()
    assert_close(x1.grad, x2.grad, **TOL)
    theirs = _torch_grads(layer)
    mine = {n: p.grad for n, p in block.named_parameters()}
    assert mine.keys() == theirs.keys()
    for name, grad in mine.items():
        assert_close(grad, theirs[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@param("norm_first", [True, False], ids=["pre-norm", "post-norm"])
@param("activation", ["relu", "gelu"])
@param("mask_name", ["none", "causal", "padding"])
def test_eval_values_match_torch_fast_path(norm_first, activation, mask_name):
    """In eval mode without gradients the layer runs its fused native kernel
    (torch._transformer_encoder_layer_fwd); dropout is off on both sides."""
    block = _block(norm_first, activation, dropout=0.3).eval()
    layer = to_torch_encoder_layer(block)
    assert not layer.training and layer.dropout.p == 0.3
    mask, torch_masks = _masks(mask_name)
    with torch.no_grad():
        for need_weights in (False, True):
            out, _ = block(_x(), mask=mask, need_weights=need_weights)
            assert_close(out, layer(_x(), **torch_masks), **TOL)


@param("norm_first", [True, False], ids=["pre-norm", "post-norm"])
def test_need_weights_path_gives_the_same_block_output(norm_first):
    block = _block(norm_first)
    mask, _ = _masks("padding & causal")
    fused, none = block(_x(), mask=mask)
    explicit, weights = block(_x(), mask=mask, need_weights=True)
    assert none is None and weights.shape == (B, H, L, L)
    assert_close(fused, explicit, **TOL)
    _, attn_weights = block.attn(block.norm1(_x()) if norm_first else _x(), mask=mask)
    assert_close(weights, attn_weights)


@param("norm_first", [True, False])
@param("activation", ["relu", "gelu"])
def test_round_trip_block_torch_block_is_exact(norm_first, activation):
    block = _block(norm_first, activation, dropout=0.25).eval()
    back = from_torch_encoder_layer(to_torch_encoder_layer(block))
    assert type(back) is TransformerBlock
    assert back.state_dict().keys() == block.state_dict().keys()
    for name, value in block.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    assert back.norm_first is norm_first and not back.training
    assert type(back.activation) is type(block.activation)
    assert [m.p for m in back.modules() if isinstance(m, nn.Dropout)] == [0.25] * 4
    assert back.d_ff == D_FF and back.attn.num_heads == H


@param("norm_first", [True, False])
@param("activation", ["relu", "gelu", F.relu, F.gelu, nn.ReLU(), nn.GELU()],
       ids=["relu", "gelu", "F.relu", "F.gelu", "nn.ReLU", "nn.GELU"])
def test_round_trip_torch_block_torch_is_exact(norm_first, activation):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.2, activation=activation,
                                       batch_first=True, norm_first=norm_first,
                                       layer_norm_eps=1e-6)
    block = from_torch_encoder_layer(layer)
    assert block.training
    assert block.norm1.eps == block.norm2.eps == 1e-6
    back = to_torch_encoder_layer(block)
    assert back.state_dict().keys() == layer.state_dict().keys()
    for name, value in layer.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    assert back.norm_first is norm_first and back.self_attn.batch_first and back.training
    assert back.norm1.eps == back.norm2.eps == 1e-6 and back.dropout.p == 0.2
    assert back.activation_relu_or_gelu == layer.activation_relu_or_gelu
    layer.eval()
    block.eval()
    with torch.no_grad():  # the torch layer's own initialisation and epsilon, converted
        assert_close(block(_x())[0], layer(_x()), **TOL)


def test_a_sequence_first_layer_converts_to_a_batch_first_block():
    """Weights do not care about the layout (as for from_torch_mha): the block takes
    (B, L, d_model) where the layer wanted (L, B, d_model)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.0)  # batch_first=False
    block = from_torch_encoder_layer(layer)
    x = _x()
    assert_close(block(x)[0], layer(x.transpose(0, 1)).transpose(0, 1), **TOL)
    assert to_torch_encoder_layer(block).self_attn.batch_first


def test_dtype_and_device_are_copied():
    block = _block().double()
    layer = to_torch_encoder_layer(block)
    assert layer.linear1.weight.dtype == torch.float64
    assert layer.self_attn.in_proj_weight.dtype == torch.float64
    back = from_torch_encoder_layer(layer)
    assert back.linear1.weight.dtype == torch.float64
    assert_close(back(_x().double())[0], layer(_x().double()))


# --- what one side has and the other has not: refused ------------------------------------

def _layer(**kw):
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(D, H, D_FF, **{"batch_first": True, **kw})


def _with(layer, **attributes):
    for name, value in attributes.items():
        setattr(layer, name, value)
    return layer


REFUSED_FROM_TORCH = {
    "bias=False": (lambda: _layer(bias=False), ValueError, "bias=True"),
    "layer_norm_eps differs": (
        lambda: _with(_layer(), norm2=nn.LayerNorm(D, eps=1e-6)), ValueError,
        r"norm1.eps=1e-05, norm2.eps=1e-06"),
    "LayerNorm without affine": (
        lambda: _with(_layer(), norm1=nn.LayerNorm(D, elementwise_affine=False)),
        ValueError, "norm1 to be an nn.LayerNorm with a weight and a bias"),
    "RMSNorm": (lambda: _with(_layer(), norm1=nn.RMSNorm(D)), ValueError,
                "norm1 to be an nn.LayerNorm"),
    "custom activation": (lambda: _layer(activation=F.silu), ValueError,
                          "activation 'relu' or 'gelu'"),
    "tanh GELU": (lambda: _layer(activation=nn.GELU(approximate="tanh")), ValueError,
                  "activation 'relu' or 'gelu'"),
    "kdim/vdim": (lambda: _with(_layer(), self_attn=nn.MultiheadAttention(
        D, H, kdim=4, vdim=4, batch_first=True)), ValueError, "kdim == vdim == d_model"),
    "add_bias_kv": (lambda: _with(_layer(), self_attn=nn.MultiheadAttention(
        D, H, add_bias_kv=True, batch_first=True)), ValueError, "add_bias_kv"),
    "dropouts differ": (lambda: _with(_layer(dropout=0.1), dropout2=nn.Dropout(0.3)),
                        ValueError, r"dropout2=0.3"),
    "not a dropout": (lambda: _with(_layer(), dropout=nn.Identity()), ValueError,
                      "dropout=not nn.Dropout"),
    "linear without bias": (lambda: _with(_layer(), linear2=nn.Linear(D_FF, D, bias=False)),
                            ValueError, "linear2 to be an nn.Linear with a bias"),
    "self_attn replaced": (lambda: _with(_layer(), self_attn=nn.Identity()), TypeError,
                           "self_attn to be a torch.nn.MultiheadAttention"),
    "a decoder layer": (lambda: nn.TransformerDecoderLayer(D, H, D_FF), TypeError,
                        "torch.nn.TransformerEncoderLayer"),
}


@param("case", list(REFUSED_FROM_TORCH))
def test_from_torch_refuses_what_the_block_has_not(case):
    make, error, message = REFUSED_FROM_TORCH[case]
    layer = make()
    with pytest.raises(error, match=message) as excinfo:
        from_torch_encoder_layer(layer)
    assert str(excinfo.value).startswith("layer: expected")


def _swap(block, **attributes):
    block = copy.deepcopy(block)
    for name, value in attributes.items():
        setattr(block, name, value)
    return block


REFUSED_TO_TORCH = {
    "grouped-query attention": (lambda: _block(num_kv_heads=2), ValueError,
                                "one key/value head per query head"),
    "tanh GELU": (lambda: _swap(_block(), activation=nn.GELU(approximate="tanh")),
                  ValueError, r"activation nn.ReLU\(\) or nn.GELU\(\)"),
    "SiLU": (lambda: _swap(_block(), activation=nn.SiLU()), ValueError,
             r"activation nn.ReLU\(\) or nn.GELU\(\)"),
    "dropouts differ": (lambda: _swap(_block(dropout=0.1), ffn_dropout=nn.Dropout(0.2)),
                        ValueError, r"ffn_dropout=0.2"),
    "eps differ": (lambda: _swap(_block(), norm1=nn.LayerNorm(D, eps=1e-6)), ValueError,
                   r"norm1.eps=1e-06, norm2.eps=1e-05"),
    "linear without bias": (lambda: _swap(_block(), linear1=nn.Linear(D, D_FF, bias=False)),
                            ValueError, "linear1 to be an nn.Linear with a bias"),
    "attention without bias": (lambda: _swap(_block(), attn=MultiHeadAttention(D, H, bias=False)),
                               ValueError, "attention with biases"),
    "not a block": (lambda: MultiHeadAttention(D, H), TypeError, "mha_lib.TransformerBlock"),
}


@param("case", list(REFUSED_TO_TORCH))
def test_to_torch_refuses_what_the_layer_has_not(case):
    make, error, message = REFUSED_TO_TORCH[case]
    block = make()
    with pytest.raises(error, match=message) as excinfo:
        to_torch_encoder_layer(block)
    assert str(excinfo.value).startswith(("block: expected", "m: expected"))


# --- the block itself -----------------------------------------------------------------------

def test_the_block_calls_its_submodules():
    """Forward hooks on every submodule fire, and a replaced submodule is used: the block
    never reaches past a module to its weights."""
    for norm_first in (True, False):
        block = _block(norm_first)
        names = ["attn", "norm1", "norm2", "linear1", "activation", "ffn_dropout",
                 "linear2", "dropout1", "dropout2"]
        called = []
        for name in names:
            getattr(block, name).register_forward_hook(
                lambda *_, name=name, called=called: called.append(name))
        block(_x())
        assert sorted(called) == sorted(names)
        before, _ = block(_x())
        block.linear2 = nn.Sequential(block.linear2, nn.Tanh())
        after, _ = block(_x())
        assert not torch.allclose(before, after)


@param("norm_first", [True, False])
def test_formulas_of_pre_and_post_norm(norm_first):
    """The two layouts written out with the block's own submodules."""
    block = _block(norm_first)
    x = _x()

    def attn(y):
        return block.attn(y, need_weights=False)[0]

    def ffn(y):
        return block.linear2(block.activation(block.linear1(y)))

    if norm_first:
        h = x + attn(block.norm1(x))
        expected = h + ffn(block.norm2(h))
    else:
        h = block.norm1(x + attn(x))
        expected = block.norm2(h + ffn(h))
    assert_close(block(x)[0], expected)
    assert_close(block.feed_forward(x), ffn(x))


def test_feed_forward_is_position_wise():
    block = _block()
    x = _x()
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    assert_close(block.feed_forward(x[:, perm]), block.feed_forward(x)[:, perm])
    assert_close(block.feed_forward(x[1, 2]), block.feed_forward(x)[1, 2])


def test_is_causal_equals_the_causal_mask_and_future_does_not_leak():
    block = _block()
    x = _x()
    assert_close(block(x, is_causal=True)[0], block(x, mask=causal_mask(L))[0], **TOL)
    changed = x.clone()
    changed[:, 4:] += 1.0
    out, changed_out = block(x, is_causal=True)[0], block(changed, is_causal=True)[0]
    assert_close(out[:, :4], changed_out[:, :4], **TOL)
    assert not torch.allclose(out[:, 4:], changed_out[:, 4:])


@param("num_kv_heads", [None, 2, 1])
def test_cached_decoding_equals_the_full_causal_pass(num_kv_heads):
    block = _block(num_kv_heads=num_kv_heads).eval()
    if num_kv_heads:
        assert isinstance(block.attn, GroupedQueryAttention)
    x = _x()
    full, full_w = block(x, is_causal=True, need_weights=True)
    cache = KVCache(1)
    first, _ = block(x[:, :4], is_causal=True, cache=cache)
    steps = [block(x[:, i:i + 1], cache=cache, need_weights=True) for i in (4, 5)]
    assert_close(torch.cat([first] + [s[0] for s in steps], dim=1), full, **TOL)
    assert_close(steps[-1][1], full_w[..., 5:, :], **TOL)


def test_dropout_acts_in_training_only():
    block = _block(dropout=0.5).train()
    x = _x()
    torch.manual_seed(0)
    a = block(x)[0]
    torch.manual_seed(1)
    b = block(x)[0]
    assert not torch.allclose(a, b)
    block.eval()
    assert_close(block(x)[0], block(x)[0])
    assert_close(block(x)[0], _block(dropout=0.0).eval()(x)[0])


def test_repr_and_sizes():
    block = TransformerBlock(8, 4, 32, norm_first=False, activation="relu")
    assert "d_model=8, d_ff=32, norm_first=False" in repr(block)
    assert isinstance(block.activation, nn.ReLU)
    sizes = {n: tuple(p.shape) for n, p in block.named_parameters()}
    assert sizes["linear1.weight"] == (32, 8) and sizes["linear2.weight"] == (8, 32)
    attention, ffn, norms = 4 * (8 * 8 + 8), 2 * 8 * 32 + 32 + 8, 2 * 2 * 8
    assert sum(p.numel() for p in block.parameters()) == attention + ffn + norms


# torch.compile(fullgraph=True) and torch.export of the block, on both paths:
# test_practitioner.test_compile_fullgraph_and_export_every_module[block].


# --- TinyTransformer is built from it ------------------------------------------------------

def test_tiny_transformer_is_a_stack_of_transformer_blocks():
    import mha_lib.model

    assert not hasattr(mha_lib.model, "Block")
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 4, 2, max_len=12, d_ff=24)
    assert all(type(b) is TransformerBlock for b in model.blocks)
    assert all(b.norm_first and isinstance(b.activation, nn.GELU) and b.d_ff == 24
               for b in model.blocks)
    assert TinyTransformer(11, 16, 4, 1, 12).blocks[0].d_ff == 64
    idx = torch.randint(11, (2, 7))
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(7))
    for block in model.blocks:
        x, _ = block(x, mask=causal_mask(7))
    assert_close(model(idx), model.head(model.ln_f(x)), **TOL)


def test_public_names():
    for name in ("TransformerBlock", "to_torch_encoder_layer", "from_torch_encoder_layer"):
        assert name in mha_lib.__all__
