"""KVCache, and decoding with it: feeding a sequence step by step (or chunk by chunk) through
the cache gives exactly what full causal self-attention over the sequence gives."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import GroupedQueryAttention, KVCache, MultiHeadAttention, causal_mask
from mha_lib.cache import LayerCache

param = pytest.mark.parametrize
TOL = dict(atol=1e-5, rtol=1e-5)

MODULES = {
    "mha": lambda: MultiHeadAttention(16, 4),
    "gqa": lambda: GroupedQueryAttention(16, 4, num_kv_heads=2),
    "mqa": lambda: GroupedQueryAttention(16, 4, num_kv_heads=1),
}


# ---------------------------------------------------------------------------------------------
# The cache itself
# ---------------------------------------------------------------------------------------------


def test_update_appends_and_returns_everything():
    cache = KVCache()
    assert cache.length == 0 and cache.nbytes == 0
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    keys, values = cache.update(k1, v1)
    assert keys is k1 and values is v1 and cache.length == 4
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    keys, values = cache.update(k2, v2)
    assert cache.length == 5
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert cache.nbytes == 2 * 2 * 3 * 5 * 5 * 4  # keys and values, B H L D, float32


def test_layers_are_separate():
    cache = KVCache(num_layers=3)
    assert cache.num_layers == 3
    layer1 = cache.layer(1)
    assert isinstance(layer1, LayerCache)
    layer1.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    assert (cache.layer_length(0), layer1.length, cache.layer(2).length) == (0, 3, 0)
    cache.update(torch.randn(1, 2, 6, 4, dtype=torch.float16),
                 torch.randn(1, 2, 6, 4, dtype=torch.float16), layer=2)
    assert cache.nbytes == 2 * (1 * 2 * 3 * 4 * 4 + 1 * 2 * 6 * 4 * 2)
    assert "length=0" in repr(cache) and "layer=1" in repr(layer1)


def test_bad_updates_are_refused():
    cache = KVCache()
    cache.update(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"key: expected shape \(2, 3, L_new, 5\).*got shape "
                                         r"\(2, 2, 1, 5\)"):
        cache.update(torch.randn(2, 2, 1, 5), torch.randn(2, 2, 1, 5))
    with pytest.raises(ValueError, match=r"key: .*dtype torch.float32.*got .*torch.float64"):
        cache.update(torch.randn(2, 3, 1, 5).double(), torch.randn(2, 3, 1, 5).double())
    with pytest.raises(ValueError, match=r"value: expected shape \(2, 3, 1, 5\)"):
        cache.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 2, 5))
    with pytest.raises(ValueError, match=r"key: expected a 4-D tensor"):
        cache.update(torch.randn(3, 1, 5), torch.randn(3, 1, 5))
    assert cache.length == 4  # nothing was appended
    with pytest.raises(ValueError, match="num_layers: expected a positive int, got 0"):
        KVCache(0)
    with pytest.raises(ValueError, match=r"index: expected a layer in \[0, 2\), got 2"):
        KVCache(2).layer(2)


# ---------------------------------------------------------------------------------------------
# Decoding with the cache == full causal attention
# ---------------------------------------------------------------------------------------------


@param("kind", list(MODULES))
@param("need_weights", [True, False])
def test_step_by_step_equals_full_causal_attention(kind, need_weights):
    torch.manual_seed(0)
    m = MODULES[kind]().eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        full, _ = m(x, mask=causal_mask(7), need_weights=need_weights)
        cache = KVCache()
        steps = []
        for t in range(7):  # one new token per call, no mask: it may see all cached ones
            out, weights = m(x[:, t:t + 1], cache=cache, need_weights=need_weights)
            steps.append(out)
            if need_weights:
                assert weights.shape == (2, 4, 1, t + 1)
    assert_close(torch.cat(steps, dim=1), full, **TOL)
    assert cache.length == 7
    assert cache.keys[0].shape == (2, m.num_kv_heads, 7, 4)


@param("kind", list(MODULES))
@param("need_weights", [True, False])
def test_chunks_with_bottom_right_causal_mask(kind, need_weights):
    """A prompt, then chunks of several tokens: each chunk needs causal_mask(Lq, Lk), whose
    query i is position Lk - Lq + i."""
    torch.manual_seed(1)
    m = MODULES[kind]().eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        full, _ = m(x, mask=causal_mask(9), need_weights=need_weights)
        cache = KVCache()
        outs = []
        for start, stop in ((0, 4), (4, 6), (6, 7), (7, 9)):
            mask = causal_mask(stop - start, stop)  # (Lq, L_past + Lq)
            outs.append(m(x[:, start:stop], mask=mask, cache=cache,
                          need_weights=need_weights)[0])
    assert_close(torch.cat(outs, dim=1), full, **TOL)


def test_both_paths_agree_with_a_cache():
    torch.manual_seed(2)
    m = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(1, 6, 16)
    outs = {}
    with torch.no_grad():
        for need_weights in (True, False):
            cache = KVCache()
            m(x[:, :4], mask=causal_mask(4), cache=cache, need_weights=need_weights)
            outs[need_weights] = m(x[:, 4:], mask=causal_mask(2, 6), cache=cache,
                                   need_weights=need_weights)[0]
    assert_close(outs[True], outs[False], **TOL)


def test_sdpa_is_causal_aligns_top_left():
    """The pitfall: SDPA's is_causal=True with Lq != Lk lets the queries see only the
    first keys. causal_mask aligns bottom-right, which is what decoding needs."""
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(top_left, v[:, :, :1])  # the one query attended key 0 only
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(1, 5))
    assert_close(ours, F.scaled_dot_product_attention(q, k, v))  # the last query sees all
    assert not torch.allclose(ours, top_left)
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]


def test_mask_must_cover_cached_positions():
    m = MultiHeadAttention(16, 4)
    cache = KVCache()
    m(torch.randn(2, 3, 16), mask=causal_mask(3), cache=cache)
    with pytest.raises(ValueError, match=r"mask: expected a shape broadcastable to "
                                         r"\(B=2, H=4, Lq=2, Lk=5\), got \(2, 2\)"):
        m(torch.randn(2, 2, 16), mask=causal_mask(2), cache=cache)
    m(torch.randn(2, 2, 16), mask=causal_mask(2, 5), cache=cache)
    assert cache.length == 5


def test_cache_of_another_module_is_refused():
    cache = KVCache()
    MultiHeadAttention(16, 4)(torch.randn(2, 3, 16), cache=cache)
    with pytest.raises(ValueError, match=r"key: expected shape \(2, 4, L_new, 4\)"):
        GroupedQueryAttention(16, 4, 2)(torch.randn(2, 1, 16), cache=cache)
    with pytest.raises(TypeError, match="cache: expected a KVCache"):
        MultiHeadAttention(16, 4)(torch.randn(2, 3, 16), cache={"keys": []})


@param("num_kv_heads", [4, 2, 1])
def test_gqa_cache_is_smaller(num_kv_heads):
    m = GroupedQueryAttention(16, 4, num_kv_heads)
    cache = KVCache()
    with torch.no_grad():
        m(torch.randn(3, 10, 16), mask=causal_mask(10), cache=cache, need_weights=False)
    assert cache.nbytes == 2 * 3 * num_kv_heads * 10 * 4 * 4  # K and V, B H_kv L D, float32
