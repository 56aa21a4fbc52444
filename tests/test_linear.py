"""``fast_linear``, the fused path's projections on oneDNN (chapter 13).

It must be ``F.linear`` in every way a caller can see: values and gradients (to float32
rounding), second derivatives, forward-mode AD, ``torch.func``, autocast. It must take the
oneDNN route where it is meant to (float32 CPU products of at least ``MIN_WORK``
multiply-adds), or the speed-up is silently lost, and ``F.linear``'s everywhere else. And
the module's fused path, which runs on it, must still agree with the explicit path at
sizes that take it.

``MIN_WORK`` is lowered to ``SMALL`` (the ``small_products`` fixture) so that small
tensors take the oneDNN route; one test checks the real threshold.
"""

from __future__ import annotations

import platform

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    causal_mask,
    linear,
    padding_mask,
)
from mha_lib.linear import MIN_WORK, fast_linear, onednn_available

param = pytest.mark.parametrize
ONEDNN = "_OneDNNLinearBackward"
needs_onednn = pytest.mark.skipif(not onednn_available(), reason="PyTorch without oneDNN")
ROWS = 256  # rows of the test inputs; with 24 in and 20 out features, SMALL multiply-adds
SMALL = ROWS * 24 * 20


@pytest.fixture
def small_products(monkeypatch):
    """oneDNN from ``SMALL`` multiply-adds on: small test tensors take its route."""
    monkeypatch.setattr(linear, "MIN_WORK", SMALL)


@pytest.fixture
def all_products(monkeypatch):
    """oneDNN for every float32 CPU product, however small."""
    monkeypatch.setattr(linear, "MIN_WORK", 1)


def _inputs(shape, in_features=24, out_features=20, bias=True, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, in_features, generator=gen, dtype=dtype).requires_grad_()
    weight = torch.randn(out_features, in_features, generator=gen, dtype=dtype)
    b = torch.randn(out_features, generator=gen, dtype=dtype) if bias else None
    return x, torch.nn.Parameter(weight), None if b is None else torch.nn.Parameter(b)


def _route(y: torch.Tensor) -> str:
    return type(y.grad_fn).__name__


@needs_onednn
def test_real_threshold_routes_big_products_to_onednn():
    """1024 rows at d_model = 512 is exactly ``MIN_WORK``; one row fewer is MKL's."""
    assert MIN_WORK == 1024 * 512 * 512
    layer = torch.nn.Linear(512, 512)
    for rows, route in ((1024, ONEDNN), (1023, "AddmmBackward0")):
        x = torch.randn(rows, 512, requires_grad=True)
        y = fast_linear(x, layer.weight, layer.bias)
        assert _route(y) == route
        assert_close(y, layer(x))


def test_onednn_is_available_on_x86_builds_with_mkldnn():
    """On the machines the book is built and tested on, the fast route exists: if a
    PyTorch upgrade removed the operator, the speed-up would vanish without an error."""
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available():
        assert onednn_available()


@needs_onednn
@param("shape", [(ROWS,), (4, 100), (2, 3, 50)])
@param("bias", [True, False])
def test_values_and_gradients_match_f_linear(small_products, shape, bias):
    x, weight, b = _inputs(shape, bias=bias)
    y = fast_linear(x, weight, b)
    assert _route(y) == ONEDNN
    expected = F.linear(x, weight, b)
    assert_close(y, expected)
    grad = torch.randn_like(y)
    params = (x, weight) if b is None else (x, weight, b)
    for ours, ref in zip(torch.autograd.grad(y, params, grad),
                         torch.autograd.grad(expected, params, grad), strict=True):
        assert_close(ours, ref)


@needs_onednn
def test_expanded_and_non_contiguous_inputs(small_products):
    """``.sum().backward()`` hands the backward an expanded (stride 0) gradient; a
    transposed input is not contiguous."""
    x, weight, b = _inputs((40, 8))
    xt = x.transpose(0, 1)  # (8, 40, in), not contiguous
    y = fast_linear(xt, weight, b)
    assert _route(y) == ONEDNN
    y.sum().backward()
    ours = [t.grad.clone() for t in (x, weight, b)]
    for t in (x, weight, b):
        t.grad = None
    F.linear(xt, weight, b).sum().backward()
    for got, t in zip(ours, (x, weight, b), strict=True):
        assert_close(got, t.grad)


@needs_onednn
def test_frozen_weights_get_no_gradient(small_products):
    x, weight, b = _inputs((ROWS,))
    weight.requires_grad_(False)
    y = fast_linear(x, weight, b)
    assert _route(y) == ONEDNN
    y.sum().backward()
    assert weight.grad is None and b.grad is not None
    assert_close(x.grad, torch.ones(ROWS, 20) @ weight)


@needs_onednn
def test_second_derivatives_match_f_linear(small_products):
    x, weight, b = _inputs((ROWS,))

    def second(fn):
        (gx,) = torch.autograd.grad(fn(x, weight, b).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), (x, weight, b))

    for ours, ref in zip(second(fast_linear), second(F.linear), strict=True):
        assert_close(ours, ref)


@needs_onednn
# PyTorch's own forward-mode formulas script a helper with the deprecated torch.jit.script.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_mode_ad_matches_f_linear(small_products):
    x, weight, b = (t.detach() for t in _inputs((ROWS,)))
    tangents = [torch.randn_like(t) for t in (x, weight, b)]
    results = []
    for fn in (fast_linear, F.linear):
        with fwAD.dual_level():
            duals = [fwAD.make_dual(t, d) for t, d in zip((x, weight, b), tangents, strict=True)]
            out = fwAD.unpack_dual(fn(*duals))
            results.append((out.primal.clone(), out.tangent.clone()))
    assert_close(results[0][0], results[1][0])
    assert_close(results[0][1], results[1][1])


def test_torch_func_transforms_match_f_linear(small_products):
    x, weight, b = (t.detach() for t in _inputs((4, ROWS)))
    assert_close(torch.func.vmap(lambda r: fast_linear(r, weight, b))(x),
                 torch.func.vmap(lambda r: F.linear(r, weight, b))(x))
    assert_close(torch.func.grad(lambda w: fast_linear(x, w, b).square().sum())(weight),
                 torch.func.grad(lambda w: F.linear(x, w, b).square().sum())(weight))


@param("case", ["few rows", "float64", "bfloat16", "autocast", "no grad few rows"])
def test_falls_back_to_f_linear_bit_for_bit(small_products, case):
    """Where oneDNN is not worth it or not meant for the input, the result is
    ``F.linear``'s exactly, and so is its backward node."""
    rows = ROWS - 1 if case.startswith("few rows") or case.startswith("no grad") else ROWS
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    x, weight, b = _inputs((rows,), dtype=dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"), \
            torch.set_grad_enabled(case != "no grad few rows"):
        y, expected = fast_linear(x, weight, b), F.linear(x, weight, b)
    assert y.dtype == expected.dtype
    assert torch.equal(y, expected)
    if y.grad_fn is not None:
        assert _route(y) == _route(expected) != ONEDNN


@needs_onednn
def test_inference_mode_and_no_grad(small_products):
    x, weight, b = _inputs((ROWS,))
    with torch.inference_mode():
        y = fast_linear(x, weight, b)
    assert y.grad_fn is None
    assert_close(y, F.linear(x, weight, b).detach())


# The module's fused path on the oneDNN route.

def _grads(module, x, *args, **kwargs):
    out, _ = module(x, *args, **kwargs)
    grad = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    params = [x, *module.parameters()]
    return out, torch.autograd.grad(out, params, grad)


@needs_onednn
@param("mask_kind", ["none", "causal", "padding"])
@param("cls", [MultiHeadAttention, GroupedQueryAttention])
def test_fused_path_on_onednn_agrees_with_explicit(all_products, mask_kind, cls):
    torch.manual_seed(0)
    batch, length = 2, 40
    module = cls(64, 8, 2) if cls is GroupedQueryAttention else cls(64, 8)
    x = torch.randn(batch, length, 64, requires_grad=True)
    mask = {"none": None, "causal": causal_mask(length),
            "padding": padding_mask(torch.tensor([length, 0]), length)}[mask_kind]
    fused, fused_grads = _grads(module, x, mask=mask, need_weights=False)
    explicit, explicit_grads = _grads(module, x, mask=mask, need_weights=True)
    assert _route(fused) == ONEDNN and _route(explicit) != ONEDNN
    assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    for ours, ref in zip(fused_grads, explicit_grads, strict=True):
        assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_fused_cross_attention_and_cache_on_onednn(all_products):
    torch.manual_seed(0)
    module = MultiHeadAttention(64, 4).eval()
    query, memory = torch.randn(1, 48, 64), torch.randn(1, 56, 64)
    with torch.no_grad():
        assert_close(module(query, memory, need_weights=False)[0],
                     module(query, memory)[0], rtol=1e-5, atol=1e-5)
        cache, full = KVCache(), module(memory, mask=causal_mask(56))[0]
        first = module(memory[:, :48], mask=causal_mask(48), need_weights=False, cache=cache)[0]
        rest = module(memory[:, 48:], mask=causal_mask(8, 56), need_weights=False,
                      cache=cache)[0]
    assert_close(torch.cat([first, rest], dim=1), full, rtol=1e-5, atol=1e-5)
