"""Multi-head latent attention (chapter 18) against an independent formulation written
with einsum from its own weights; the absorbed form equals the explicit one; decoding
with a KVCache equals the full causal forward on both paths, and the cache holds only
the latent and the rotary key; masks and errors behave as in MultiHeadAttention."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.utils.prune
from torch.overrides import TorchFunctionMode

from mha_lib import (
    KVCache,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    apply_rotary,
    causal_mask,
    padding_mask,
    sliding_window_mask,
)

param = pytest.mark.parametrize


def mla_by_einsum(m, x, mask):
    """DeepSeek-V2's equations (10)-(19) written out per head, no library helpers but
    apply_rotary."""
    B, L, _ = x.shape
    H, D, R = m.num_heads, m.head_dim, m.rope_dim
    pos = torch.arange(L)
    c = m.kv_down(x)  # (B, L, C)
    k_c = torch.einsum("blc,hdc->bhld", c, m.k_up.weight.view(H, D, -1))
    v_c = torch.einsum("blc,hdc->bhld", c, m.v_up.weight.view(H, D, -1))
    k_r = apply_rotary(m.k_rope_proj(x), pos)  # (B, L, R), shared by the heads
    q_c = m.q_proj(x).view(B, L, H, D).permute(0, 2, 1, 3)
    q_r = apply_rotary(m.q_rope_proj(x).view(B, L, H, R).permute(0, 2, 1, 3), pos)
    scores = (torch.einsum("bhid,bhjd->bhij", q_c, k_c)
              + torch.einsum("bhir,bjr->bhij", q_r, k_r)) / (D + R) ** 0.5
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    o = torch.einsum("bhij,bhjd->bihd", weights, v_c).reshape(B, L, H * D)
    return m.out_proj(o), weights


@param("config", [(16, 4, 6, 4, None), (12, 3, 5, 2, 6), (8, 1, 3, 2, None)])
@param("absorb", [False, True])
@param("need_weights", [True, False])
def test_equals_the_equations(config, absorb, need_weights):
    torch.manual_seed(0)
    d_model, H, C, R, D = config
    m = MultiHeadLatentAttention(d_model, H, C, R, head_dim=D, bias=True)
    x = torch.randn(2, 5, d_model)
    out, weights = m(x, is_causal=True, absorb=absorb, need_weights=need_weights)
    ref, ref_weights = mla_by_einsum(m, x, causal_mask(5))
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights)
    else:
        assert weights is None


@param("absorb", [False, True])
@param("need_weights", [True, False])
@param("chunks", [[1] * 6, [2, 3, 1], [6]])
def test_cached_decoding_equals_full_causal_forward(absorb, need_weights, chunks):
    torch.manual_seed(1)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 6, 16)
    full, _ = m(x, is_causal=True)
    cache, outs, t = KVCache(), [], 0
    for n in chunks:
        outs.append(m(x[:, t:t + n], is_causal=True, cache=cache, absorb=absorb,
                      need_weights=need_weights)[0])
        t += n
    torch.testing.assert_close(torch.cat(outs, 1), full)
    # only the rotary key (B, 1, L, R) and the latent (B, 1, L, C)
    assert cache.keys[0].shape == (2, 1, 6, 4)
    assert cache.values[0].shape == (2, 1, 6, 6)
    assert cache.nbytes == 2 * 6 * (4 + 6) * 4
    torch.testing.assert_close(cache.values[0][:, 0], m.kv_down(x))


def test_windowed_cache_equals_the_sliding_window_mask():
    torch.manual_seed(2)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(1, 9, 16)
    full, _ = m(x, mask=sliding_window_mask(9, 3))
    cache = KVCache(window=3)
    outs = [m(x[:, t:t + 1], cache=cache, is_causal=True)[0] for t in range(9)]
    torch.testing.assert_close(torch.cat(outs, 1), full)
    assert cache.kept == 2


@param("need_weights", [True, False])
def test_masks_like_multi_head_attention(need_weights):
    torch.manual_seed(3)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 5, 16)
    pad = padding_mask(torch.tensor([5, 3]))  # (B, 1, 1, Lk)
    a, _ = m(x, mask=pad & causal_mask(5), need_weights=need_weights)
    b, _ = m(x, mask=pad, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(a, b)
    ref, _ = mla_by_einsum(m, x, pad & causal_mask(5))
    torch.testing.assert_close(a, ref)
    # a fully masked row gives zeros before out_proj, as MultiHeadAttention does
    nothing = torch.zeros(5, 5, dtype=torch.bool)
    out, _ = m(x, mask=nothing, need_weights=need_weights)
    torch.testing.assert_close(out, torch.zeros(2, 5, 16))  # bias=False by default
    float_mask = torch.zeros(5, 5).masked_fill(~causal_mask(5), float("-inf"))
    c, _ = m(x, mask=float_mask, need_weights=need_weights)
    torch.testing.assert_close(c, m(x, is_causal=True)[0])


def test_bad_input_is_refused():
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"mask: .*3-D"):
        m(x, mask=torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask: expected is_causal=True"):
        m(x, cache=KVCache())
    with pytest.raises(ValueError, match=r"cache: expected one layer"):
        m(x[:, :1], cache=KVCache(2))
    with pytest.raises(ValueError, match=r"rope_dim: expected an even"):
        MultiHeadLatentAttention(16, 4, 6, 3)
    other = MultiHeadAttention(16, 4)
    cache = KVCache()
    m(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"cache: layer 0"):
        other(x[:, :1], cache=cache)


def test_both_paths_call_the_modules_own_layers():
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    called = []
    for name in ("q_proj", "q_rope_proj", "kv_down", "k_rope_proj", "out_proj"):
        getattr(m, name).register_forward_hook(lambda *a, n=name: called.append(n))
    m(torch.randn(1, 3, 16), is_causal=True, need_weights=False, absorb=True)
    assert sorted(called) == sorted(["q_proj", "q_rope_proj", "kv_down", "k_rope_proj",
                                     "out_proj"])


def test_the_cache_is_smaller_than_multi_head_attentions():
    """C + R numbers per token and layer instead of 2 * H * D."""
    m = MultiHeadLatentAttention(64, 8, 16, 4)
    mha = MultiHeadAttention(64, 8)
    x = torch.randn(1, 10, 64)
    ours, theirs = KVCache(), KVCache()
    m(x, is_causal=True, cache=ours)
    mha(x, is_causal=True, cache=theirs)
    assert ours.nbytes == 10 * (16 + 4) * 4
    assert theirs.nbytes == 10 * 2 * 64 * 4


# Graph capture (torch.compile fullgraph, torch.export) of rotary and latent attention on
# every path: test_practitioner.test_compile_fullgraph_and_export_every_module.


def test_absorbed_form_sees_what_the_layers_do_now():
    """Pruned and spectrally normalised k_up and v_up, whose `.weight` is recomputed only
    when the layer is called: after an update of the underlying weights (an optimizer
    step), the absorbed form follows, as the explicit one does. (Eval mode: in training,
    spectral_norm takes a power-iteration step at every call.)"""
    torch.manual_seed(5)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    torch.nn.utils.prune.l1_unstructured(m.k_up, "weight", amount=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.spectral_norm(m.v_up)
    x = torch.randn(2, 5, 16)
    for step in range(3):
        with torch.no_grad():  # what an optimizer step does
            m.k_up.weight_orig.mul_(1.5).add_(0.1)
            m.v_up.weight_orig.add_(torch.randn_like(m.v_up.weight_orig))
        absorbed, _ = m(x, is_causal=True, absorb=True)
        explicit, _ = m(x, is_causal=True)
        torch.testing.assert_close(absorbed, explicit, msg=f"step {step}")


@param("need_weights", [True, False])
def test_absorbed_form_trains_the_layers_it_calls(need_weights):
    """Gradients reach k_up and v_up (and a LoRA inside them) through the absorbed form,
    the same as through the explicit one."""
    torch.manual_seed(6)
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    x = torch.randn(2, 5, 16)
    grads = {}
    for absorb in (False, True):
        m.zero_grad()
        out, _ = m(x, is_causal=True, absorb=absorb, need_weights=need_weights)
        (out * torch.arange(16.0)).sum().backward()
        grads[absorb] = (m.k_up.weight.grad.clone(), m.v_up.weight.grad.clone())
    for ours, theirs in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(ours, theirs)


def test_biases_of_the_up_layers_are_carried_in_the_absorbed_form():
    """An affine k_up or v_up (a bias added by a wrapper or a hook) keeps the two forms
    equal, with dropout on and on a row with nothing to attend to."""
    torch.manual_seed(7)
    m = MultiHeadLatentAttention(16, 4, 6, 4)
    m.k_up = torch.nn.Linear(6, 16)  # with biases
    m.v_up = torch.nn.Linear(6, 16)
    x = torch.randn(2, 5, 16)
    mask = causal_mask(5).clone()
    mask[2] = False  # query 2 sees nothing: zero output, not v_up's bias
    for need_weights in (True, False):
        explicit, w1 = m(x, mask=mask, need_weights=need_weights)
        absorbed, w2 = m(x, mask=mask, absorb=True, need_weights=need_weights)
        torch.testing.assert_close(absorbed, explicit)
        if need_weights:
            torch.testing.assert_close(w2, w1)
    m.train().attn_dropout.p = 0.5
    for need_weights in (True, False):
        torch.manual_seed(8)
        explicit, _ = m(x, mask=mask, need_weights=need_weights)
        torch.manual_seed(8)
        absorbed, _ = m(x, mask=mask, absorb=True, need_weights=need_weights)
        torch.testing.assert_close(absorbed, explicit)


def half_to_adjacent(d):
    """Feature k of the adjacent layout is feature perm[k] of the "rotate half" one."""
    return torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).flatten()


@param("absorb", [False, True])
def test_interleaved_rotary_layout_is_the_permuted_half_layout(absorb):
    """DeepSeek's adjacent-pair layout: interleaved=True equals the default layout with the
    rows of q_rope_proj and k_rope_proj permuted (chapter 16), and equals the equations
    with an adjacent-pair rotation."""
    torch.manual_seed(9)
    half = MultiHeadLatentAttention(16, 4, 6, 4, bias=True)
    adjacent = MultiHeadLatentAttention(16, 4, 6, 4, bias=True, interleaved=True)
    adjacent.load_state_dict(half.state_dict())
    perm = half_to_adjacent(4)  # R = 4
    rows = torch.cat([h * 4 + perm for h in range(4)])  # per head of q_rope_proj
    with torch.no_grad():
        for layer, index in ((adjacent.q_rope_proj, rows), (adjacent.k_rope_proj, perm)):
            layer.weight.copy_(layer.weight[index])
            layer.bias.copy_(layer.bias[index])
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(adjacent(x, is_causal=True, absorb=absorb)[0],
                               half(x, is_causal=True, absorb=absorb)[0])
    assert "interleaved=True" in repr(adjacent)
    with pytest.raises(TypeError, match="interleaved: expected a bool"):
        MultiHeadLatentAttention(16, 4, 6, 4, interleaved=1)


# --- the absorbed matrices, read once per cache -----------------------------------------


def decode(m, x, cache, absorb=True, prompt=3, need_weights=True):
    """A prompt of `prompt` tokens, then one token at a time, without gradients."""
    with torch.no_grad():
        outs = [m(x[:, :prompt], is_causal=True, cache=cache, absorb=absorb,
                  need_weights=need_weights)[0]]
        outs += [m(x[:, t:t + 1], cache=cache, absorb=absorb, need_weights=need_weights)[0]
                 for t in range(prompt, x.size(1))]
    return torch.cat(outs, 1)


def count_up_calls(m):
    calls = {"k_up": 0, "v_up": 0}
    for name in calls:
        def hook(*_, n=name):
            calls[n] += 1
        getattr(m, name).register_forward_hook(hook)
    return calls


@param("need_weights", [True, False])
def test_absorbed_matrices_are_read_once_per_cache(need_weights):
    """Decoding without gradients, k_up and v_up are called once per cache (at the
    prefill), not at every step; a new cache, or reset(), reads them again; and the
    decode still equals the explicit form."""
    torch.manual_seed(10)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 9, 16)
    explicit = decode(m, x, KVCache(), absorb=False, need_weights=need_weights)
    calls = count_up_calls(m)
    cache = KVCache()
    absorbed = decode(m, x, cache, need_weights=need_weights)  # 1 prefill + 6 steps
    assert calls == {"k_up": 1, "v_up": 1}
    torch.testing.assert_close(absorbed, explicit, atol=1e-6, rtol=1e-5)
    decode(m, x, cache.reset(), need_weights=need_weights)
    decode(m, x, KVCache(), need_weights=need_weights)
    assert calls == {"k_up": 3, "v_up": 3}
    # without a cache, or recording gradients, each call reads its own
    m(x, is_causal=True, absorb=True)
    with torch.no_grad():
        m(x, is_causal=True, absorb=True)
    grad_cache = KVCache()
    m(x[:, :3], is_causal=True, cache=grad_cache, absorb=True)
    m(x[:, 3:4], cache=grad_cache, absorb=True)
    assert calls == {"k_up": 7, "v_up": 7}


def test_absorbed_matrices_of_a_cache_are_those_of_its_prefill():
    """Kept matrices hold the weights of the prefill, as the cached latents do: change
    the weights, start a new cache (which follows them)."""
    torch.manual_seed(11)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(1, 6, 16)
    cache = KVCache()
    with torch.no_grad():
        m(x[:, :5], is_causal=True, cache=cache, absorb=True)
        m.v_up.weight.mul_(2.0)
        stale, _ = m(x[:, 5:], cache=cache, absorb=True)
    new = decode(m, x, KVCache(), prompt=5)[:, 5:]
    explicit = decode(m, x, KVCache(), absorb=False, prompt=5)[:, 5:]
    torch.testing.assert_close(new, explicit)
    assert not torch.allclose(stale, new)


class LoRA(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update, as LoRA wraps one."""

    def __init__(self, base, rank=2):
        super().__init__()
        self.base = base
        self.a = torch.nn.Linear(base.in_features, rank, bias=False)
        self.b = torch.nn.Linear(rank, base.out_features, bias=False)
        torch.nn.init.normal_(self.b.weight)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


def test_absorbed_cached_decode_follows_a_lora_wrapper():
    torch.manual_seed(12)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    m.k_up, m.v_up = LoRA(m.k_up), LoRA(m.v_up)
    x = torch.randn(2, 7, 16)
    full, _ = m(x, is_causal=True)
    torch.testing.assert_close(decode(m, x, KVCache()), full)
    torch.testing.assert_close(decode(m, x, KVCache(), need_weights=False), full)


@param("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copied_cache_keeps_its_absorbed_matrices(how):
    """A used cache, copied (with its module, as the owner check wants), continues the
    decode as the original does, without reading k_up and v_up again; reorder (beam
    search) keeps the matrices, which belong to the layer, not to a sequence."""
    import copy
    import io
    import pickle

    torch.manual_seed(13)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 8, 16)
    cache = KVCache()
    decode(m, x[:, :5], cache)
    if how == "deepcopy":
        m2, cache2 = copy.deepcopy((m, cache))
    elif how == "pickle":
        m2, cache2 = pickle.loads(pickle.dumps((m, cache)))
    else:
        buffer = io.BytesIO()
        torch.save(cache, buffer)
        buffer.seek(0)
        with torch.serialization.safe_globals([KVCache]):
            cache2 = torch.load(buffer, weights_only=True)
        m2 = m
    calls = count_up_calls(m2)
    with torch.no_grad():
        theirs = [m2(x[:, t:t + 1], cache=cache2, absorb=True)[0] for t in range(5, 8)]
        ours = [m(x[:, t:t + 1], cache=cache, absorb=True)[0] for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(theirs, 1), torch.cat(ours, 1))
    assert calls == {"k_up": 0, "v_up": 0}
    beams = torch.tensor([1, 1, 0])
    cache2.reorder(beams)
    with torch.no_grad():
        m2(torch.zeros(3, 1, 16), cache=cache2, absorb=True)
        assert calls == {"k_up": 0, "v_up": 0}
        m2(torch.zeros(3, 1, 16), cache=cache2.reset(), absorb=True)
    assert calls == {"k_up": 1, "v_up": 1}  # the reset cache reads them again


def test_cached_absorbed_decode_compiles_fullgraph():
    """A decode step that reads the kept matrices (or keeps them, on a new cache)
    captures as one graph, with the numbers of eager."""
    torch.manual_seed(14)
    m = MultiHeadLatentAttention(16, 4, 6, 4).eval()
    x = torch.randn(2, 6, 16)
    full, _ = m(x, is_causal=True)

    def step(t, cache):
        return m(t, cache=cache, absorb=True, need_weights=False)[0]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for prefill in (True, False):
        cache, outs = KVCache(), []
        with torch.no_grad():
            if prefill:
                outs.append(m(x[:, :1], cache=cache, absorb=True)[0])
            outs += [compiled(x[:, t:t + 1], cache) for t in range(len(outs), 6)]
        torch.testing.assert_close(torch.cat(outs, 1), full)


@pytest.mark.parametrize("latent_dim, rope_dim", [(16, 8), (512, 64), (13, 6)])
def test_absorbed_form_hands_the_kernel_widths_divisible_by_8(latent_dim: int,
                                                              rope_dim: int) -> None:
    """The absorbed form's queries/keys [c, 1, k_r] and values [c, 1] are padded with
    zeros to multiples of 8: PyTorch's fused GPU kernels refuse other widths in 16 bits
    (at C = 512, R = 64 the unpadded 577/513 sent decoding to the math kernel on an
    H200, the GPU record's decode_fourth_run). The zeros change nothing: the output
    equals the explicit form's."""
    from mha_lib.exercises.verdict import Recorder

    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(64, 4, latent_dim, rope_dim, head_dim=16).eval()
    x = torch.randn(2, 5, 64)
    with torch.no_grad(), Recorder() as seen:
        absorbed, _ = mla(x, is_causal=True, absorb=True, need_weights=False)
    calls = seen.find(torch.nn.functional.scaled_dot_product_attention)
    assert calls, "the fused path calls F.scaled_dot_product_attention"
    q, k, v = calls[0][1][:3]
    assert q.size(-1) % 8 == 0 and k.size(-1) % 8 == 0 and v.size(-1) % 8 == 0, (
        q.shape, k.shape, v.shape)
    with torch.no_grad():
        explicit, _ = mla(x, is_causal=True, need_weights=False)
    torch.testing.assert_close(absorbed, explicit, atol=1e-5, rtol=1e-5)


class _BigTensors(TorchFunctionMode):
    """Records the shape of every tensor a torch function returns with at least
    `size` numbers and its own storage (a view of the cache is not counted)."""

    def __init__(self, size, storages):
        super().__init__()
        self.size, self.storages, self.made = size, storages, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.numel() >= self.size
                    and t.untyped_storage().data_ptr() not in self.storages):
                self.made.append((getattr(func, "__name__", str(func)),
                                  tuple(t.shape)))
        return out


@param("need_weights", [True, False])
def test_absorbed_decode_step_reads_the_cache_in_place(need_weights):
    """A cached absorbed decoding step makes no tensor as large as the cached latents:
    it reads the latents and rotary keys where the cache keeps them, instead of
    concatenating them into one key tensor at every step (a copy of the whole cache
    per token). The explicit form, which rebuilds every head's keys, does make one."""
    torch.manual_seed(3)
    m = MultiHeadLatentAttention(32, 4, kv_latent_dim=32, rope_dim=4).eval()
    x = torch.randn(2, 43, 32)
    for absorb in (True, False):
        cache = KVCache()
        with torch.no_grad():
            m(x[:, :40], is_causal=True, cache=cache, absorb=absorb)
            m(x[:, 40:41], cache=cache, absorb=absorb)  # the storage grows here
            latents = cache.values[0]  # (2, 1, 41, 32)
            storages = {t.untyped_storage().data_ptr()
                        for t in (cache.keys[0], latents)}
            with _BigTensors(latents.numel(), storages) as watch:
                out, _ = m(x[:, 41:42], cache=cache, absorb=absorb,
                           need_weights=need_weights)
        assert cache.values[0].untyped_storage().data_ptr() in storages  # no regrowth
        if absorb:
            assert watch.made == [], watch.made
        else:
            assert watch.made, "the explicit form rebuilds (2, 4, 42, 8) keys"
