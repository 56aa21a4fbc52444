"""KVCache, and decoding with it: feeding a sequence step by step (or chunk by chunk) through
the cache gives exactly what full causal self-attention over the sequence gives."""

import copy
import gc
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mha_lib import GroupedQueryAttention, KVCache, MultiHeadAttention, causal_mask
from mha_lib.cache import LayerCache
from mha_lib.masks import sliding_window_mask

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
    assert torch.equal(keys, k1) and torch.equal(values, v1) and cache.length == 4
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)
    keys, values = cache.update(k2, v2)
    assert cache.length == 5
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert cache.nbytes == 2 * 2 * 3 * 5 * 5 * 4  # keys and values, B H L D, float32


def test_values_may_be_wider_than_keys():
    cache = KVCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 6))
    keys, values = cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 6))
    assert keys.shape == (1, 2, 4, 4) and values.shape == (1, 2, 4, 6)


@torch.no_grad()  # with gradients on, each call returns new tensors (autograd may keep them)
def test_storage_grows_by_doubling_not_by_cat():
    """A long decode reallocates O(log L) times, not once per step: the storage pointer
    changes only when the capacity doubles."""
    cache = KVCache()
    capacities, storages = [], []
    for _ in range(300):
        keys, _ = cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        if not capacities or cache.allocated_nbytes != capacities[-1]:
            capacities.append(cache.allocated_nbytes)
            storages.append(keys.untyped_storage())
        else:  # no reallocation: the keys are a view of the same storage
            assert keys.untyped_storage().data_ptr() == storages[-1].data_ptr()
    assert cache.length == 300
    per_position = 2 * 1 * 2 * 4 * 4  # keys and values, B H_kv D, float32
    assert [c // per_position for c in capacities] == [16, 32, 64, 128, 256, 512]
    assert cache.allocated_nbytes <= 2 * cache.nbytes  # at most half empty


def test_window_keeps_the_last_positions_and_flat_memory():
    cache = KVCache(window=4)
    stream = torch.randn(1, 2, 50, 3)
    sizes = set()
    for t in range(50):
        keys, values = cache.update(stream[:, :, t:t + 1], -stream[:, :, t:t + 1])
        # the new token sees itself and the window - 1 = 3 positions before it
        assert torch.equal(keys, stream[:, :, max(0, t - 3):t + 1])
        assert torch.equal(values, -stream[:, :, max(0, t - 3):t + 1])
        sizes.add(cache.allocated_nbytes)
    assert (cache.length, cache.kept) == (50, 3)
    assert cache.nbytes == 2 * 1 * 2 * 3 * 3 * 4
    assert len(sizes) == 1  # allocated once, never grown
    keys, _ = cache.update(stream[:, :, :5], stream[:, :, :5])  # a chunk after 3 kept
    assert keys.shape[2] == 3 + 5 and cache.kept == 3


def test_reset_forgets_positions_and_owners():
    cache = KVCache(2)
    m = MultiHeadAttention(16, 4)
    m(torch.randn(1, 3, 16), is_causal=True, cache=cache.layer(0))
    cache.reset()
    assert (cache.length, cache.nbytes, cache.allocated_nbytes) == (0, 0, 0)
    MultiHeadAttention(16, 4)(torch.randn(1, 3, 16), is_causal=True, cache=cache.layer(0))
    assert cache.length == 3


def test_cache_does_not_keep_the_graph_unless_asked():
    m = MultiHeadAttention(16, 4)
    x = torch.randn(1, 4, 16, requires_grad=True)
    cache = KVCache()
    m(x, is_causal=True, cache=cache)
    assert not cache.keys[0].requires_grad and cache.keys[0].grad_fn is None
    # this call's own keys still get gradients
    out, _ = m(x[:, :1] * 2, cache=cache)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    kept = KVCache(keep_graph=True)
    m(x, is_causal=True, cache=kept)
    assert kept.keys[0].grad_fn is not None


def test_layers_are_separate():
    cache = KVCache(num_layers=3)
    assert cache.num_layers == 3
    layer1 = cache.layer(1)
    assert isinstance(layer1, LayerCache)
    layer1.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    assert (cache.layer(0).length, layer1.length, cache.layer(2).length) == (0, 3, 0)
    cache.update(torch.randn(1, 2, 6, 4, dtype=torch.float16),
                 torch.randn(1, 2, 6, 4, dtype=torch.float16), layer=2)
    assert cache.nbytes == 2 * (1 * 2 * 3 * 4 * 4 + 1 * 2 * 6 * 4 * 2)
    assert "length=0" in repr(cache) and "layer=1" in repr(layer1)


def test_bad_updates_are_refused():
    cache = KVCache()
    cache.update(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"key: expected shape \(2, 3, N, 5\).*got shape "
                                         r"\(2, 2, 1, 5\)"):
        cache.update(torch.randn(2, 2, 1, 5), torch.randn(2, 2, 1, 5))
    with pytest.raises(ValueError, match=r"key: .*dtype torch.float32.*got .*torch.float64"):
        cache.update(torch.randn(2, 3, 1, 5).double(), torch.randn(2, 3, 1, 5).double())
    with pytest.raises(ValueError, match=r"value: expected shape \(2, 3, 1, Dv\)"):
        cache.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 2, 5))
    with pytest.raises(ValueError, match=r"key: expected a 4-D tensor"):
        cache.update(torch.randn(3, 1, 5), torch.randn(3, 1, 5))
    assert cache.length == 4  # nothing was appended
    with pytest.raises(ValueError, match="num_layers: expected a positive int, got 0"):
        KVCache(0)
    with pytest.raises(ValueError, match="window: expected a positive int, got 0"):
        KVCache(window=0)
    with pytest.raises(TypeError, match="keep_graph: expected a bool"):
        KVCache(keep_graph="yes")
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


def test_whole_multi_layer_cache_is_refused():
    with pytest.raises(ValueError, match=r"cache: expected one layer's cache, cache\.layer\(i\)"
                                         r".*got a KVCache with 3 layers"):
        MultiHeadAttention(16, 4)(torch.randn(2, 1, 16), cache=KVCache(3))


@param("need_weights", [True, False])
def test_cached_chunk_needs_mask_or_is_causal(need_weights):
    torch.manual_seed(4)
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    with pytest.raises(ValueError, match=r"mask: expected is_causal=True"):
        m(x, cache=KVCache(), need_weights=need_weights)
    full, _ = m(x, is_causal=True, need_weights=need_weights)
    assert_close(full, m(x, mask=causal_mask(6), need_weights=need_weights)[0], **TOL)
    cache = KVCache()
    first, _ = m(x[:, :4], is_causal=True, cache=cache, need_weights=need_weights)
    second, _ = m(x[:, 4:], is_causal=True, cache=cache, need_weights=need_weights)
    assert_close(torch.cat([first, second], dim=1), full, **TOL)


@param("kind", list(MODULES))
@param("need_weights", [True, False])
def test_windowed_cache_equals_sliding_window_attention(kind, need_weights):
    torch.manual_seed(5)
    m = MODULES[kind]().eval()
    x = torch.randn(2, 11, 16)
    window = 4
    with torch.no_grad():
        full, _ = m(x, mask=sliding_window_mask(11, window), need_weights=need_weights)
        cache = KVCache(window=window)
        outs = [m(x[:, :5], is_causal=True, cache=cache, need_weights=need_weights)[0]]
        outs += [m(x[:, t:t + 1], cache=cache, need_weights=need_weights)[0]
                 for t in range(5, 9)]
        outs.append(m(x[:, 9:], is_causal=True, cache=cache, need_weights=need_weights)[0])
    assert_close(torch.cat(outs, dim=1), full, **TOL)
    assert cache.kept == window - 1


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
    """One layer's cache reused by a second module would mix their keys: refused, even when
    the shapes happen to match."""
    cache = KVCache()
    first = MultiHeadAttention(16, 4)
    first(torch.randn(2, 3, 16), is_causal=True, cache=cache)
    for other in (MultiHeadAttention(16, 4), GroupedQueryAttention(16, 4, 2)):
        with pytest.raises(ValueError, match=r"cache: layer 0 of this KVCache already holds "
                                             r"the keys of another module"):
            other(torch.randn(2, 1, 16), cache=cache)
    assert cache.length == 3  # nothing appended by the refused calls
    first(torch.randn(2, 1, 16), cache=cache)  # the owner may go on
    assert cache.length == 4
    with pytest.raises(TypeError, match="cache: expected a KVCache"):
        MultiHeadAttention(16, 4)(torch.randn(2, 3, 16), cache={"keys": []})


@param("num_kv_heads", [4, 2, 1])
def test_gqa_cache_is_smaller(num_kv_heads):
    m = GroupedQueryAttention(16, 4, num_kv_heads)
    cache = KVCache()
    with torch.no_grad():
        m(torch.randn(3, 10, 16), mask=causal_mask(10), cache=cache, need_weights=False)
    assert cache.nbytes == 2 * 3 * num_kv_heads * 10 * 4 * 4  # K and V, B H_kv L D, float32


# ---------------------------------------------------------------------------------------------
# Whose cache it is: an id the writing module carries, copied with it
# ---------------------------------------------------------------------------------------------


def test_a_module_built_again_cannot_continue_the_cache_of_the_gone_one():
    """Running a notebook cell again builds a new model while the old cache lives on: the
    new module (same class, same shapes) is refused after the old one is collected."""
    cache = KVCache()
    first = MultiHeadAttention(16, 4)
    first(torch.randn(2, 3, 16), is_causal=True, cache=cache)
    del first
    gc.collect()
    again = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"cache: layer 0 of this KVCache already holds the "
                                         r"keys of another module \(a MultiHeadAttention"):
        again(torch.randn(2, 1, 16), cache=cache)
    again(torch.randn(2, 1, 16), cache=cache.reset())
    assert cache.length == 1


def _decode(m, x, cache):
    return m(x, cache=cache, need_weights=False)[0]


def test_copies_of_module_and_cache_together_go_on_decoding():
    """copy.deepcopy((model, cache)) and pickle: the copied module is the writer of the
    copied cache, and continues it exactly as the original continues its own; a cache saved
    with torch.save loads with weights_only=True and its writer continues it."""
    torch.manual_seed(6)
    m = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    cache = KVCache()
    with torch.no_grad():
        m(x[:, :4], is_causal=True, cache=cache)
        copies = {"deepcopy": copy.deepcopy((m, cache)),
                  "pickle": pickle.loads(pickle.dumps((m, cache)))}
        buffer = io.BytesIO()
        torch.save(cache, buffer)
        buffer.seek(0)
        with torch.serialization.safe_globals([KVCache]):
            copies["torch.save"] = (m, torch.load(buffer, weights_only=True))
        expected = _decode(m, x[:, 4:], cache)
        for how, (m2, cache2) in copies.items():
            assert cache2.length == 4, how
            assert_close(_decode(m2, x[:, 4:], cache2), expected, msg=how)
            assert cache2.length == 5 and cache.length == 5, how


def test_a_used_cache_pickles_alone_and_its_writer_continues_the_copy():
    """A copy of the cache alone (a beam branched off, say) is continued by the module that
    wrote the original; another module is still refused."""
    torch.manual_seed(7)
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, 4, 16)
    with torch.no_grad():
        cache = KVCache()
        m(x[:, :3], is_causal=True, cache=cache)
        branch = pickle.loads(pickle.dumps(cache))
        assert_close(_decode(m, x[:, 3:], branch), _decode(m, x[:, 3:], cache))
        with pytest.raises(ValueError, match="another module"):
            _decode(MultiHeadAttention(16, 4), x[:, 3:], copy.deepcopy(branch))


# ---------------------------------------------------------------------------------------------
# Beam search: reorder(), read-only keys and values
# ---------------------------------------------------------------------------------------------


@param("window", [None, 3])
@param("kind", list(MODULES))
def test_reorder_is_decoding_the_reordered_sequences(kind, window):
    """After cache.reorder(indices) the next step is what decoding the sequences x[indices]
    from the start gives: rows picked, repeated, dropped, in the given order."""
    torch.manual_seed(8)
    m = MODULES[kind]().eval()
    x = torch.randn(3, 6, 16)
    indices = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        cache = KVCache(window=window)
        m(x[:, :5], is_causal=True, cache=cache)
        assert cache.reorder(indices) is cache and cache.batch_size == 4
        step = _decode(m, x[indices, 5:], cache)
        fresh = KVCache(window=window)
        m(x[indices, :5], is_causal=True, cache=fresh)
        assert_close(step, _decode(m, x[indices, 5:], fresh), **TOL)
        for ours, theirs in zip(cache.keys + cache.values, fresh.keys + fresh.values,
                                strict=True):
            assert_close(ours, theirs, **TOL)


def test_keys_and_values_are_read_only():
    cache = KVCache(2)
    cache.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    for seq in (cache.keys, cache.values):
        assert isinstance(seq, tuple) and len(seq) == 2 and seq[1] is None
        with pytest.raises(TypeError, match=r"read-only .* cache\.reorder\(indices\)"):
            seq[0] = torch.zeros(2, 1, 3, 4)
    with pytest.raises(ValueError, match=r"indices: expected indices into the cache's batch "
                                         r"of 2 sequences, in \[0, 2\), got values from 0 to 2"):
        cache.reorder(torch.tensor([0, 2]))
    with pytest.raises(TypeError, match=r"indices: expected an integer tensor"):
        cache.reorder(torch.tensor([0.0, 1.0]))
    assert cache.keys[0].shape == (2, 1, 3, 4)  # nothing changed


def test_another_batch_size_is_refused_naming_the_batch():
    m = MultiHeadAttention(16, 4)
    cache = KVCache()
    m(torch.randn(2, 3, 16), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"cache: holds a batch of 2 sequences, got a call with "
                                         r"a batch of 3; .* cache\.reorder"):
        m(torch.randn(3, 1, 16), cache=cache)


# ---------------------------------------------------------------------------------------------
# Training through a cached decode
# ---------------------------------------------------------------------------------------------


@param("need_weights", [True, False])
def test_training_the_queries_through_a_cached_decode(need_weights):
    """Only q_proj trains (keys and values frozen, so they need no graph): a loss summed over
    a cached decode backpropagates with the default cache, and gives q_proj the gradient of
    the same loss over the full causal forward."""
    torch.manual_seed(9)
    m = MultiHeadAttention(16, 4)
    for p in m.parameters():
        p.requires_grad_(p is m.q_proj.weight)
    x = torch.randn(2, 6, 16)
    weights = torch.randn(2, 6, 16)
    cache = KVCache()
    steps = [m(x[:, :3], is_causal=True, cache=cache, need_weights=need_weights)[0]]
    steps += [m(x[:, t:t + 1], cache=cache, need_weights=need_weights)[0] for t in range(3, 6)]
    (torch.cat(steps, 1) * weights).sum().backward()
    decoded = m.q_proj.weight.grad.clone()
    m.q_proj.weight.grad = None
    (m(x, is_causal=True, need_weights=need_weights)[0] * weights).sum().backward()
    assert_close(decoded, m.q_proj.weight.grad, **TOL)


def test_a_windowed_cache_allocates_the_window_and_an_eighth() -> None:
    """KVCache(window=64) decoding 1,000 tokens keeps 63 positions and allocates 63 + 8
    (not 2 * 63 + 1, the storage before chapter 17's review), and its outputs stay those
    of the sliding-window mask."""
    from mha_lib import MultiHeadAttention
    from mha_lib.masks import sliding_window_mask

    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 300, 8)
    cache = KVCache(window=64)
    with torch.no_grad():
        full, _ = attention(x, mask=sliding_window_mask(300, 64))
        steps = [attention(x[:, t:t + 1], is_causal=True, cache=cache)[0]
                 for t in range(300)]
        for _ in range(700):
            cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), owner=None)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=0)
    per_position = 2 * 2 * 4 * 4  # keys and values, 2 heads, 4 dims, float32
    assert cache.kept == 63
    assert cache.allocated_nbytes == (63 + 8) * per_position
