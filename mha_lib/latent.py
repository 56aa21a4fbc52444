"""Multi-head latent attention (DeepSeek-V2), chapter 18.

Shape legend: B - batch, H - heads, Lq/Lk - query/key length, D - head
dim, R - rotary dim, C - latent dim (``kv_latent_dim``).

Every token is squeezed to one latent ``c = W_dkv x`` of width ``C``
(cached), from which each head rebuilds its key part ``W_uk[h] c`` and its
value ``W_uv[h] c``. Rotary positions cannot pass through that
reconstruction, so a small rotary key of width ``R``, shared by all heads,
is cached beside the latent (the "decoupled" RoPE of the paper). A cache
then holds ``C + R`` numbers per token and layer, whatever ``H``.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_lib._checks import (
    check_base,
    check_dropout,
    check_flags,
    check_module_dtype,
    check_positive_int,
    check_tensor,
)
from mha_lib.attention import masked_softmax, scaled_dot_product_attention
from mha_lib.cache import KVCache, LayerCache, as_layer_cache
from mha_lib.heads import merge_heads, split_heads
from mha_lib.mha import (
    check_call_mask,
    fused_kernel,
    kernel_dropout,
    with_causal,
)
from mha_lib.rotary import apply_rotary

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention: keys and values rebuilt from a cached
    low-rank latent, plus a rotary key shared by all heads.

    Layers: ``q_proj`` (``d_model -> H * D``), ``q_rope_proj``
    (``d_model -> H * R``), ``kv_down`` (``d_model -> C``, the latent),
    ``k_rope_proj`` (``d_model -> R``, the shared rotary key), ``k_up`` and
    ``v_up`` (``C -> H * D``, no bias), ``out_proj`` (``H * D ->
    d_model``). Head ``h`` scores ``q_h . [W_uk[h] c ; rope(k_r)]`` over
    ``sqrt(D + R)``. A :class:`~mha_lib.KVCache` layer passed as
    ``cache=`` holds the rotary keys ``(B, 1, L, R)`` as its keys and the
    latents ``(B, 1, L, C)`` as its values. The queries' low-rank
    compression and the latent's RMSNorm of the paper are left out.

    The rotary parts use :func:`~mha_lib.apply_rotary`'s "rotate half"
    layout by default: features ``i`` and ``i + R/2`` form a pair.
    DeepSeek's released weights pair adjacent features ``2i`` and
    ``2i + 1``: run them with ``interleaved=True``, or permute the output
    rows of ``q_rope_proj`` and ``k_rope_proj`` as chapter 16 shows. Every
    layer is called, never its weights read, on both paths and in both
    forms (``absorb``).
    Derived in chapter 18.

    Args:
        d_model: Width of every token vector.
        num_heads: Number of heads ``H``.
        kv_latent_dim: Width ``C`` of the cached latent.
        rope_dim: Width ``R`` of the rotary part of queries and keys
            (even).
        head_dim: Width ``D`` of each head's key part and value; defaults
            to ``d_model // num_heads``.
        dropout: Probability of zeroing an attention weight in training.
        bias: Whether ``q_proj``, ``q_rope_proj``, ``kv_down``,
            ``k_rope_proj`` and ``out_proj`` have biases.
        base: The base of the rotary frequencies.
        interleaved: The rotary pair layout of
            :func:`~mha_lib.apply_rotary`: adjacent features (True,
            DeepSeek's checkpoints) or the two halves (False).

    Example:
        >>> mla = MultiHeadLatentAttention(16, num_heads=4, kv_latent_dim=8,
        ...                                rope_dim=2)
        >>> x = torch.randn(2, 6, 16)
        >>> out, _ = mla(x, is_causal=True)
        >>> absorbed, _ = mla(x, is_causal=True, absorb=True)
        >>> out.shape, torch.allclose(out, absorbed, atol=1e-5)
        (torch.Size([2, 6, 16]), True)
    """

    def __init__(self, d_model: int, num_heads: int, kv_latent_dim: int,
                 rope_dim: int, head_dim: int | None = None,
                 dropout: float = 0.0, bias: bool = False,
                 base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        head_dim = check_latent(d_model, num_heads, kv_latent_dim,
                                rope_dim, head_dim, dropout, base,
                                interleaved)
        self.d_model = d_model
        self.num_heads = num_heads
        self.kv_latent_dim = kv_latent_dim
        self.rope_dim = rope_dim
        self.head_dim = head_dim
        self.base = float(base)
        self.interleaved = interleaved
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.q_rope_proj = nn.Linear(d_model, num_heads * rope_dim,
                                     bias=bias)
        self.kv_down = nn.Linear(d_model, kv_latent_dim, bias=bias)
        self.k_rope_proj = nn.Linear(d_model, rope_dim, bias=bias)
        self.k_up = nn.Linear(kv_latent_dim, inner, bias=False)
        self.v_up = nn.Linear(kv_latent_dim, inner, bias=False)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
        *,
        is_causal: bool = False,
        cache: KVCache | LayerCache | None = None,
        absorb: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention of ``x`` ``(B, L, d_model)``; returns ``(output
        (B, L, d_model), weights (B, H, L, Lk) or None)``.

        Args:
            x: ``(B, L, d_model)``, the tokens (self-attention only).
            mask: bool (True = may attend) or float (added), of shape
                ``(Lq, Lk)`` or ``(B|1, H|1, Lq, Lk)``, as for
                :class:`~mha_lib.MultiHeadAttention`.
            need_weights: True runs the explicit path and returns the
                weights; False runs ``F.scaled_dot_product_attention``.
            is_causal: Each query attends the keys up to its own position
                (aligned bottom-right; the sliding window of a windowed
                cache). Combined with ``mask`` if both are given.
            cache: One layer of a :class:`~mha_lib.KVCache` (or a one-layer
                ``KVCache``): the latents and rotary keys of the new tokens
                are appended and the queries attend to every kept position.
                A call with more than one new token needs ``mask`` or
                ``is_causal=True``.
            absorb: False rebuilds every head's keys and values from the
                latents; True folds ``k_up`` into the queries and ``v_up``
                into the output, attending over the latents directly (the
                same result up to rounding). The maps of ``k_up`` and
                ``v_up`` are read by calling each layer once on the ``C``
                basis vectors and zero (``2 (C + 1) C H D``
                multiply-adds), so they must be affine in their input: a
                plain, wrapped (LoRA), hooked, pruned, parametrized or
                quantized linear layer is; a layer with a nonlinear hook
                is not, and needs ``absorb=False``. With a ``cache`` and no
                gradients recorded (``torch.no_grad``,
                ``torch.inference_mode``: decoding), the two matrices are
                read once, at the first absorbed call, and kept with the
                cache for every later step (``LayerCache.derived``): like
                the cached latents they hold the weights of that moment,
                so change the weights, start a new cache. Otherwise each
                call reads its own (gradients then reach ``k_up`` and
                ``v_up``).
        """
        layer = self._check_inputs(x, mask, need_weights, is_causal, cache,
                                   absorb)
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, Lq, D)
        q_rope = split_heads(self.q_rope_proj(x),
                             self.num_heads)  # (B, H, Lq, R)
        latent = self.kv_down(x).unsqueeze(1)  # (B, 1, Lq, C)
        k_rope = self.k_rope_proj(x).unsqueeze(1)  # (B, 1, Lq, R)
        # Positions, cache and causal mask (chapters 14, 16, 17):
        q_rope, k_rope, latent, mask = self._in_sequence(
            q_rope, k_rope, latent, mask, is_causal, layer)
        scale = (self.head_dim + self.rope_dim) ** -0.5
        if absorb:
            out, weights = self._absorbed(q, q_rope, latent, k_rope, mask,
                                          need_weights, scale, layer)
        else:
            out, weights = self._rebuilt(q, q_rope, latent, k_rope, mask,
                                         need_weights, scale)
        return self.out_proj(merge_heads(out)), weights  # (B, Lq, d_model)

    def _in_sequence(self, q_rope: torch.Tensor, k_rope: torch.Tensor,
                     latent: torch.Tensor, mask: torch.Tensor | None,
                     is_causal: bool, layer: LayerCache | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor | None]:
        """Rotate the new tokens by their positions (chapter 16), append
        their rotary keys and latents to the cache (chapter 14), restrict
        the mask to the causal keys (chapters 7, 17). Returns ``q_rope``,
        every kept rotary key ``(B, 1, Lk, R)`` and latent
        ``(B, 1, Lk, C)``, and the mask."""
        start = 0 if layer is None else layer.length
        positions = torch.arange(start, start + q_rope.size(2),
                                 device=q_rope.device)  # (Lq,)
        rotate = dict(base=self.base, interleaved=self.interleaved)
        q_rope = apply_rotary(q_rope, positions, **rotate)  # (B, H, Lq, R)
        k_rope = apply_rotary(k_rope, positions, **rotate)  # (B, 1, Lq, R)
        if layer is not None:  # the cache holds only k_rope and the latent
            # (B, 1, Lk, R), (B, 1, Lk, C):
            k_rope, latent = layer.update(k_rope, latent, owner=self)
        if is_causal:
            window = None if layer is None else layer.window
            mask = with_causal(mask, q_rope.size(2), latent.size(2), window,
                               q_rope.device)  # (..., Lq, Lk)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q_rope.dtype)
        return q_rope, k_rope, latent, mask

    def _rebuilt(self, q: torch.Tensor, q_rope: torch.Tensor,
                 latent: torch.Tensor, k_rope: torch.Tensor,
                 mask: torch.Tensor | None, need_weights: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every head's keys and values rebuilt from the latents by
        ``k_up`` and ``v_up``. Returns ``(B, H, Lq, D)`` and the weights."""
        # Every head's keys (B, H, Lk, D + R) and values (B, H, Lk, D):
        keys = torch.cat([
            split_heads(self.k_up(latent[:, 0]), self.num_heads),
            k_rope.expand(-1, self.num_heads, -1, -1)], dim=-1)
        values = split_heads(self.v_up(latent[:, 0]), self.num_heads)
        queries = torch.cat([q, q_rope], dim=-1)  # (B, H, Lq, D + R)
        return self._attend(queries, keys, values, mask, need_weights,
                            scale)

    def _absorbed(self, q: torch.Tensor, q_rope: torch.Tensor,
                  latent: torch.Tensor, k_rope: torch.Tensor,
                  mask: torch.Tensor | None, need_weights: bool,
                  scale: float, layer: LayerCache | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over the latents: ``q_h . W_uk[h] c = (W_uk[h]^T q_h)
        . c``, and ``sum_j w_j W_uv[h] c_j = W_uv[h] sum_j w_j c_j``. The
        cached latents and rotary keys are read where they lie (no copy of
        the cache). Returns ``(B, H, Lq, D)`` and the weights."""
        w_uk, w_uv = self._up_matrices(latent, layer)  # (H, D, C + 1) each
        size = self.kv_latent_dim
        # (B, H, Lq, D) @ (H, D, C) -> (B, H, Lq, C): keys' up-projection
        # moved to the query side. k_up's bias (column C) adds q . b_k to
        # every key of a row alike, which the softmax cancels.
        q_lat = q @ w_uk[..., :size]
        # The rotary scores (B, H, Lq, Lk), over the cache's rotary keys:
        rotary = self._shared_scores(q_rope, k_rope)
        if need_weights:
            scores = (self._shared_scores(q_lat, latent) + rotary) * scale
            weights = masked_softmax(scores, mask).to(q.dtype)
            weights = self.attn_dropout(weights)  # (B, H, Lq, Lk)
            total = weights.sum(dim=-1, keepdim=True)  # 1, or 0: empty row
            out = self._shared_sum(weights, latent)  # (B, H, Lq, C)
        else:
            out, total = self._fused_over_latents(q_lat, latent,
                                                  rotary * scale, mask,
                                                  scale)
            weights = None
        # (B, H, Lq, C) @ (H, C, D) -> (B, H, Lq, D): values'
        # up-projection; v_up's bias counts once per unit of weight.
        return (out @ w_uv[..., :size].transpose(1, 2)
                + total * w_uv[..., size][:, None]), weights

    def _shared_scores(self, q: torch.Tensor, k: torch.Tensor
                       ) -> torch.Tensor:
        """``q`` ``(B, H, Lq, E)`` against the one shared key head ``k``
        ``(B, 1, Lk, E)`` (a view of the cache, read in place): the H
        heads' queries as rows of one matmul, no broadcast copy of ``k``.
        Half inputs are multiplied in float32. Returns ``(B, H, Lq, Lk)``
        in float32 for half inputs, else in their dtype."""
        heads = q.size(1)
        if q.dtype in (torch.float16, torch.bfloat16):
            q, k = q.float(), k.float()
        rows = q.flatten(1, 2).unsqueeze(1)  # (B, 1, H * Lq, E)
        return (rows @ k.mT).unflatten(2, (heads, -1)).squeeze(1)

    @staticmethod
    def _shared_sum(weights: torch.Tensor, latent: torch.Tensor
                    ) -> torch.Tensor:
        """``weights`` ``(B, H, Lq, Lk)`` times the cached latents
        ``(B, 1, Lk, C)`` (read in place): ``(B, H, Lq, C)``."""
        heads = weights.size(1)
        rows = weights.flatten(1, 2).unsqueeze(1)  # (B, 1, H * Lq, Lk)
        return (rows @ latent).unflatten(2, (heads, -1)).squeeze(1)

    def _fused_over_latents(self, q_lat: torch.Tensor, latent: torch.Tensor,
                            rotary: torch.Tensor, mask: torch.Tensor | None,
                            scale: float
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``F.scaled_dot_product_attention`` with the latents as keys and
        values and the scaled rotary scores added as a float mask (the
        user's mask merged in). Returns the weighted latents
        ``(B, H, Lq, C)`` and each row's weight sum ``(B, H, Lq, 1)``."""
        bias = rotary.to(q_lat.dtype)  # (B, H, Lq, Lk)
        if mask is not None:
            bias = (bias.masked_fill(~mask, float("-inf"))
                    if mask.dtype == torch.bool else bias + mask)
        size = self.kv_latent_dim
        keys = values = latent  # (B, 1, Lk, C), the cache itself
        dropping = self.training and self.attn_dropout.p > 0
        # PyTorch's fused GPU kernels need widths divisible by 8 in 16
        # bits: zeros pad them (a copy of the latents, only then). With
        # dropout, a column of ones gives each row its kept weight.
        pad = (-size) % 8
        if pad:
            q_lat = torch.cat([q_lat, q_lat.new_zeros(
                *q_lat.shape[:-1], pad)], dim=-1)
            keys = values = torch.cat([latent, latent.new_zeros(
                *latent.shape[:-1], pad)], dim=-1)
        if dropping:
            one = torch.ones_like(latent[..., :1])  # (B, 1, Lk, 1)
            values = torch.cat([latent, one, latent.new_zeros(
                *latent.shape[:-1], (-(size + 1)) % 8)], dim=-1)
        out, _ = self._attend(q_lat, keys, values, bias, False, scale)
        if dropping:  # each row's kept weight, from the ones column
            return out[..., :size], out[..., size:size + 1]
        if mask is None:  # finite scores: every row sums to 1
            return out[..., :size], out.new_ones(*out.shape[:-1], 1)
        # 1 on a row that attends to something, 0 on an empty one:
        total = (bias > float("-inf")).any(dim=-1, keepdim=True)
        return out[..., :size], total.to(out.dtype)

    def _up_matrices(self, latent: torch.Tensor, layer: LayerCache | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_up``'s and ``v_up``'s maps, ``(H, D, C + 1)`` each: read
        once per cache when decoding without gradients (kept with the
        cache), else at every call."""
        def read() -> tuple[torch.Tensor, torch.Tensor]:
            return (self._up_matrix(self.k_up, latent),
                    self._up_matrix(self.v_up, latent))

        if layer is None or torch.is_grad_enabled():
            return read()  # gradients reach k_up and v_up through them
        return layer.derived("absorbed_up", read)  # once per cache

    def _up_matrix(self, up: nn.Module, latent: torch.Tensor
                   ) -> torch.Tensor:
        """The affine map ``c -> W c + b`` of ``up`` (``C -> H * D``) as one
        matrix ``[W_h | b_h]`` per head, ``(H, D, C + 1)``: read by calling
        the layer on the ``C`` basis vectors and on zero, in ``latent``'s
        dtype and device, so that what the layer does (a wrapper, a hook,
        a parametrization, quantization) is in it, as long as it is
        affine. A forward hook on the layer sees those ``C + 1`` inputs,
        not the latents."""
        size = self.kv_latent_dim
        basis = torch.eye(size + 1, size, dtype=latent.dtype,
                          device=latent.device)  # (C + 1, C): e_i, then 0
        out = up(basis[None])[0]  # (C + 1, H * D): W e_i + b, then b
        matrix = torch.cat([out[:-1] - out[-1:], out[-1:]])  # W^T, then b
        return matrix.T.unflatten(0, (self.num_heads, -1))  # (H, D, C + 1)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, need_weights: bool, scale: float
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Explicit (weights returned) or fused attention of ``q``
        ``(B, H, Lq, E)`` over ``k`` ``(B, H|1, Lk, E)`` and ``v``."""
        batch, heads, q_len, _ = q.shape
        shared = k.size(1) == 1 and heads > 1
        if shared:  # one key head for all: the H heads' queries as rows
            q = q.reshape(batch, 1, heads * q_len, -1)  # (B, 1, H*Lq, E)
            if mask is not None:  # (B|1, H|1, Lq, Lk) -> (B|1, 1, H*Lq, Lk)
                mask = mask.expand(*mask.shape[:-3] or (1,), heads,
                                   *mask.shape[-2:]).flatten(-3, -2)
                mask = mask.unsqueeze(1)
        if need_weights:
            out, weights = scaled_dot_product_attention(
                q, k, v, mask, self.attn_dropout, scale=scale)
        else:
            # Rows with nothing to attend to: zeros, as on the explicit
            # path.
            out = fused_kernel(q, k, v, mask,
                               kernel_dropout(self.attn_dropout),
                               scale=scale)
            weights = None
        if shared:  # back to (B, H, Lq, Dv) and (B, H, Lq, Lk)
            out = out.unflatten(2, (heads, q_len)).squeeze(1)
            if weights is not None:
                weights = weights.unflatten(2, (heads, q_len)).squeeze(1)
        return out, weights  # (B, H, Lq, Dv)

    def _check_inputs(self, x: torch.Tensor, mask: torch.Tensor | None,
                      need_weights: bool, is_causal: bool,
                      cache: KVCache | LayerCache | None, absorb: bool
                      ) -> LayerCache | None:
        check_tensor("x", x, ("B", "L", self.d_model))
        check_module_dtype("x", x, self)
        check_flags(need_weights=need_weights, is_causal=is_causal,
                    absorb=absorb)
        layer = as_layer_cache(cache)
        q_len = x.size(1)
        k_len = q_len + (0 if layer is None else layer.kept)
        check_call_mask(mask, is_causal, layer, x.size(0), self.num_heads,
                        q_len, k_len, x)
        return layer

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"kv_latent_dim={self.kv_latent_dim}, "
                f"rope_dim={self.rope_dim}, head_dim={self.head_dim}"
                + (", interleaved=True" if self.interleaved else ""))


def check_latent(d_model: int, num_heads: int, kv_latent_dim: int,
                 rope_dim: int, head_dim: int | None, dropout: float,
                 base: float, interleaved: bool) -> int:
    """``MultiHeadLatentAttention``'s arguments; returns ``head_dim``
    (``d_model // num_heads`` when None)."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads),
                        ("kv_latent_dim", kv_latent_dim),
                        ("rope_dim", rope_dim)):
        check_positive_int(name, value)
    if rope_dim % 2:
        raise ValueError(f"rope_dim: expected an even int (rotary "
                         f"pairs), got {rope_dim!r}")
    if head_dim is None:
        if d_model % num_heads:
            raise ValueError(
                f"num_heads: expected a divisor of d_model={d_model} "
                f"(or pass head_dim), got num_heads={num_heads}")
        head_dim = d_model // num_heads
    check_positive_int("head_dim", head_dim)
    check_dropout("dropout", dropout)
    check_base("base", base)
    check_flags(interleaved=interleaved)
    return head_dim
