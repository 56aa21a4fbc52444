"""TinyTransformer: a causal language model built from the library's attention; cached and
uncached decoding agree."""

import pytest
import torch
from torch.testing import assert_close

from mha_lib import GroupedQueryAttention, KVCache, MultiHeadAttention, TinyTransformer
from mha_lib.model import decode_speed

param = pytest.mark.parametrize
TOL = dict(atol=1e-5, rtol=1e-5)


def _model(num_kv_heads=None, seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(vocab_size=11, d_model=16, num_heads=4, num_layers=2, max_len=24,
                           num_kv_heads=num_kv_heads).eval()


def test_shapes_and_attention_modules():
    m = _model()
    assert all(type(b.attn) is MultiHeadAttention for b in m.blocks)
    m_gqa = _model(num_kv_heads=2)
    assert all(isinstance(b.attn, GroupedQueryAttention) and b.attn.num_kv_heads == 2
               for b in m_gqa.blocks)
    idx = torch.randint(11, (3, 7))
    assert m(idx).shape == (3, 7, 11)
    logits, weights = m(idx, need_weights=True)
    assert weights.shape == (2, 3, 4, 7, 7)  # (N, B, H, L, L)
    assert_close(logits, m(idx))
    assert_close(weights.sum(-1), torch.ones(2, 3, 4, 7))
    future = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
    assert (weights[..., future] == 0).all()  # causal


@param("num_kv_heads", [None, 2, 1])
def test_future_tokens_do_not_change_the_past(num_kv_heads):
    m = _model(num_kv_heads)
    idx = torch.randint(11, (2, 9))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    with torch.no_grad():
        assert_close(m(changed)[:, :5], m(idx)[:, :5])
        assert not torch.allclose(m(changed)[:, 5:], m(idx)[:, 5:])


@param("num_kv_heads", [None, 2, 1])
def test_cached_forward_equals_full_forward(num_kv_heads):
    m = _model(num_kv_heads)
    idx = torch.randint(11, (2, 10))
    with torch.no_grad():
        full, full_w = m(idx, need_weights=True)
        cache = m.new_cache()
        parts = [m(idx[:, :4], cache=cache)]  # a prompt of 4, then 1, then 3, then 2 tokens
        for start, stop in ((4, 5), (5, 8), (8, 10)):
            parts.append(m(idx[:, start:stop], cache=cache))
        assert cache.length == 10 and cache.num_layers == 2
        assert_close(torch.cat(parts, dim=1), full, **TOL)
        last, last_w = m(idx[:, :9], need_weights=True)  # the last token alone, with weights
        cache = m.new_cache()
        m(idx[:, :9], cache=cache)
        step, step_w = m(idx[:, 9:], cache=cache, need_weights=True)
    assert_close(step, full[:, 9:], **TOL)
    assert step_w.shape == (2, 2, 4, 1, 10)
    assert_close(step_w, full_w[..., 9:, :], **TOL)


@param("num_kv_heads", [None, 2, 1])
def test_cached_and_uncached_generation_give_the_same_tokens(num_kv_heads):
    m = _model(num_kv_heads, seed=1)
    prompt = torch.randint(11, (2, 4))
    cached = m.generate(prompt, 20)
    uncached = m.generate(prompt, 20, use_cache=False)
    assert cached.shape == (2, 24)
    assert torch.equal(cached[:, :4], prompt)
    assert torch.equal(cached, uncached)
    # greedy: every new token is the argmax of the model's logits for the sequence so far
    with torch.no_grad():
        assert torch.equal(m(cached[:, :-1])[:, 3:].argmax(-1), cached[:, 4:])
    assert torch.equal(m.generate(prompt, 0), prompt)


def test_too_long_is_a_value_error():
    m = _model()  # max_len 24
    with pytest.raises(ValueError, match=r"idx: expected at most max_len=24 positions, got "
                                         r"0 cached \+ 25 new = 25"):
        m(torch.zeros(1, 25, dtype=torch.long))
    cache = m.new_cache()
    m(torch.zeros(1, 20, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"got 20 cached \+ 5 new = 25"):
        m(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"max_new_tokens: expected .*max_len=24, got 20 \+ 5"):
        m.generate(torch.zeros(1, 20, dtype=torch.long), 5)


def test_bad_input_is_refused():
    m = _model()
    with pytest.raises(ValueError, match=r"idx: expected a 2-D tensor"):
        m(torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="idx: expected integer token ids"):
        m(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"cache: expected a KVCache with num_layers=2"):
        m(torch.zeros(1, 4, dtype=torch.long), cache=KVCache(3))
    with pytest.raises(ValueError, match="max_new_tokens: expected a non-negative int"):
        m.generate(torch.zeros(1, 4, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="num_layers: expected a positive int"):
        TinyTransformer(11, 16, 4, 0, 24)
    with pytest.raises(ValueError, match="num_kv_heads"):
        TinyTransformer(11, 16, 4, 2, 24, num_kv_heads=3)


def test_learns_to_copy_a_token():
    """A few optimizer steps: gradients reach every parameter and the loss falls."""
    m = _model().train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        first = torch.randint(11, (16, 1), generator=generator)
        idx = torch.cat([first, torch.randint(11, (16, 3), generator=generator), first], dim=1)
        logits = m(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits[:, -1], idx[:, -1])
        opt.zero_grad()
        loss.backward()
        if not losses:
            assert all(p.grad is not None for p in m.parameters())
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5]) / 2


def test_decode_speed_reports_times_and_agreement():
    m = _model().train()
    result = decode_speed(m, torch.randint(11, (1, 4)), 8, rounds=1)
    assert set(result) == {"cached_ms", "uncached_ms", "speedup", "same_tokens"}
    assert result["same_tokens"] is True
    assert result["cached_ms"] > 0 and result["uncached_ms"] > 0
    assert m.training  # its mode is restored


def test_generate_decodes_in_eval_mode_and_restores_the_modes():
    """A model left in training mode with dropout: generate still decodes greedily without
    dropout (the same tokens every run, cached or not, as in eval mode), and hands the model
    back in the modes it had, module by module."""
    torch.manual_seed(2)
    m = TinyTransformer(vocab_size=11, d_model=16, num_heads=4, num_layers=2, max_len=24,
                        dropout=0.5)
    prompt = torch.randint(11, (3, 4))
    expected = m.eval().generate(prompt, 16)
    m.train()
    m.blocks[1].ffn_dropout.eval()  # a mode of its own, kept
    modes = {name: mod.training for name, mod in m.named_modules()}
    for use_cache in (True, False, True):
        assert torch.equal(m.generate(prompt, 16, use_cache=use_cache), expected)
        assert {name: mod.training for name, mod in m.named_modules()} == modes
    m(prompt)  # still in training mode: dropout acts
    assert not torch.equal(m(prompt), m(prompt))
