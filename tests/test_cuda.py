"""The library on a CUDA GPU: fused kernels, low precision, FlexAttention.

Skipped where there is no GPU (CI, most laptops). On a machine with one:

    python -m pytest -p no:cacheprovider tests/test_cuda.py

The CPU tests check every path against references; here the same modules run on the GPU,
where ``F.scaled_dot_product_attention`` dispatches to other kernels (FlashAttention,
memory-efficient attention, cuDNN) whose answers on fully masked rows and in half
precision must still be the library's: zeros, never NaN.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mha_lib
import mha_lib.alibi
from mha_lib import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    RotaryAttention,
    TransformerBlock,
    causal_mask,
    padding_mask,
    sliding_window_mask,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

B, L, D_MODEL, H = 3, 64, 64, 4
# Tolerances per dtype for the same computation done by two kernels.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5),
       torch.float16: dict(atol=4e-3, rtol=4e-3),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
# The same, against the float32 CPU result (the GPU rounds its inputs and weights too).
CROSS = {torch.float32: dict(atol=2e-5, rtol=2e-5),
         torch.float16: dict(atol=1e-2, rtol=1e-2),
         torch.bfloat16: dict(atol=8e-2, rtol=8e-2)}
DTYPES = list(TOL)


def _modules() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "mha": MultiHeadAttention(D_MODEL, H),
        "gqa": GroupedQueryAttention(D_MODEL, H, 2),
        "rotary": RotaryAttention(D_MODEL, H, 2),
        "latent": MultiHeadLatentAttention(D_MODEL, H, kv_latent_dim=16, rope_dim=8),
    }


def _padded(device: str) -> torch.Tensor:
    """(B, 1, 1, L): sentence 0 whole, 1 half, 2 with no real token at all."""
    return padding_mask(torch.tensor([L, L // 2, 0], device=device), L)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["mha", "gqa", "rotary", "latent"])
def test_fused_equals_explicit_and_cpu(name: str, dtype: torch.dtype) -> None:
    """need_weights=False (SDPA's CUDA kernels) equals the explicit path on the GPU, and
    the float32 CPU result; a sentence with no real token gives zeros, not NaN."""
    cpu = _modules()[name].eval()
    gpu = _modules()[name].eval().to("cuda", dtype)
    x = torch.randn(B, L, D_MODEL)
    mask = _padded("cpu") & causal_mask(L)
    with torch.no_grad():
        want, _ = cpu(x, mask=mask)
        fused, none = gpu(x.to("cuda", dtype), mask=mask.cuda(), need_weights=False)
        explicit, weights = gpu(x.to("cuda", dtype), mask=mask.cuda())
    assert none is None and weights is not None
    assert not fused.isnan().any() and not explicit.isnan().any()
    torch.testing.assert_close(fused, explicit, **TOL[dtype])
    torch.testing.assert_close(fused.float().cpu(), want, **CROSS[dtype])
    # The sentence with no real token: every query sees no key, so the output is
    # out_proj of zeros (its bias), on both paths.
    with torch.no_grad():
        empty = gpu.out_proj(torch.zeros(1, D_MODEL, device="cuda", dtype=dtype))
    torch.testing.assert_close(fused[2], empty.expand(L, -1), atol=0, rtol=0)
    torch.testing.assert_close(explicit[2], empty.expand(L, -1), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_are_zero_in_every_kernel(dtype: torch.dtype) -> None:
    """The attention itself (before out_proj): rows with no key are exactly zero on the
    fused path, whichever CUDA kernel SDPA picks, and on the explicit path."""
    q, k, v = (torch.randn(B, H, L, 16, device="cuda", dtype=dtype) for _ in range(3))
    mask = _padded("cuda")
    fused, _ = mha_lib.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(fused[2], torch.zeros_like(fused[2]))
    mod = MultiHeadAttention(D_MODEL, H, bias=False).cuda().to(dtype).eval()
    x = torch.randn(B, L, D_MODEL, device="cuda", dtype=dtype)
    with torch.no_grad():
        out, _ = mod(x, mask=mask, need_weights=False)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_training_step_has_finite_gradients(dtype: torch.dtype) -> None:
    """Backward through the fused path with a padded, causal batch in half precision."""
    torch.manual_seed(0)
    block = TransformerBlock(D_MODEL, H, 4 * D_MODEL, dropout=0.1).cuda().to(dtype).train()
    x = torch.randn(B, L, D_MODEL, device="cuda", dtype=dtype, requires_grad=True)
    out, _ = block(x, mask=_padded("cuda"), is_causal=True)
    out.float().pow(2).mean().backward()
    grads = [p.grad for p in block.parameters()] + [x.grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_is_causal_matches_the_mask_on_the_gpu() -> None:
    mod = MultiHeadAttention(D_MODEL, H).cuda().eval()
    x = torch.randn(B, L, D_MODEL, device="cuda")
    with torch.no_grad():
        a, _ = mod(x, is_causal=True, need_weights=False)
        b, _ = mod(x, mask=causal_mask(L, device="cuda"))
    torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.parametrize("case", ["causal", "window", "padding", "alibi"])
def test_compiled_flex_attention_equals_the_dense_masks(case: str) -> None:
    """Chapter 17's FlexAttention forms, compiled on the GPU, against SDPA with the
    library's dense mask or ALiBi bias."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, window = 256, 32
    q, k, v = (torch.randn(2, H, n, 16, device="cuda") for _ in range(3))
    lens = torch.tensor([n, n - 40], device="cuda")
    slopes = torch.tensor(mha_lib.alibi.alibi_slopes(H), device="cuda")
    score_mod = None
    if case == "causal":
        def mask_mod(b, h, i, j):
            return i >= j
        dense = causal_mask(n, device="cuda")
    elif case == "window":
        def mask_mod(b, h, i, j):
            return (i >= j) & (i - j < window)
        dense = sliding_window_mask(n, window, device="cuda")
    elif case == "padding":
        def mask_mod(b, h, i, j):
            return j < lens[b]
        dense = padding_mask(lens, n)
    else:
        def mask_mod(b, h, i, j):
            return i >= j

        def score_mod(score, b, h, i, j):
            return score + slopes[h] * (j - i)
        dense = torch.where(causal_mask(n, device="cuda"),
                            mha_lib.alibi_bias(H, n, device="cuda"), float("-inf"))
    block = create_block_mask(mask_mod, 2, None, n, n, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    got = flex(q, k, v, score_mod=score_mod, block_mask=block)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
