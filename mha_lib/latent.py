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

from mha_lib._checks import check_positive_int, check_tensor
from mha_lib.attention import scaled_dot_product_attention
from mha_lib.cache import KVCache, LayerCache
from mha_lib.heads import merge_heads, split_heads
from mha_lib.mha import MultiHeadAttention, check_call_mask, fused_sdpa
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
    """

    def __init__(self, d_model: int, num_heads: int, kv_latent_dim: int,
                 rope_dim: int, head_dim: int | None = None,
                 dropout: float = 0.0, bias: bool = False,
                 base: float = 10000.0):
        super().__init__()
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
        if (isinstance(dropout, bool)
                or not isinstance(dropout, (int, float))
                or not 0.0 <= dropout < 1.0):
            raise ValueError(f"dropout: expected a probability in [0, 1), "
                             f"got {dropout!r}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) \
                or base <= 1:
            raise ValueError(f"base: expected a number > 1, got {base!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.kv_latent_dim = kv_latent_dim
        self.rope_dim = rope_dim
        self.head_dim = head_dim
        self.base = float(base)
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
                same result up to rounding).
        """
        layer = self._check_inputs(x, mask, need_weights, is_causal, cache,
                                   absorb)
        start = 0 if layer is None else layer.length
        q_len = x.size(1)
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, Lq, D)
        q_rope = split_heads(self.q_rope_proj(x),
                             self.num_heads)  # (B, H, Lq, R)
        latent = self.kv_down(x).unsqueeze(1)  # (B, 1, Lq, C)
        k_rope = self.k_rope_proj(x).unsqueeze(1)  # (B, 1, Lq, R)
        positions = torch.arange(start, start + q_len,
                                 device=x.device)  # (Lq,)
        q_rope = apply_rotary(q_rope, positions, self.base)
        k_rope = apply_rotary(k_rope, positions, self.base)
        if layer is not None:  # the cache holds only k_rope and the latent
            # (B, 1, Lk, R), (B, 1, Lk, C):
            k_rope, latent = layer.update(k_rope, latent, owner=self)
        k_len = latent.size(2)
        if is_causal:
            mask = MultiHeadAttention._causal(mask, q_len, k_len, layer,
                                              x.device)  # (..., Lq, Lk)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)
        scale = (self.head_dim + self.rope_dim) ** -0.5
        if absorb:
            out, weights = self._absorbed(q, q_rope, latent, k_rope, mask,
                                          need_weights, scale)
        else:
            # Every head's keys (B, H, Lk, D + R) and values (B, H, Lk, D):
            keys = torch.cat([
                split_heads(self.k_up(latent[:, 0]), self.num_heads),
                k_rope.expand(-1, self.num_heads, -1, -1)], dim=-1)
            values = split_heads(self.v_up(latent[:, 0]), self.num_heads)
            queries = torch.cat([q, q_rope], dim=-1)  # (B, H, Lq, D + R)
            out, weights = self._attend(queries, keys, values, mask,
                                        need_weights, scale)
        return self.out_proj(merge_heads(out)), weights  # (B, Lq, d_model)

    def _absorbed(self, q: torch.Tensor, q_rope: torch.Tensor,
                  latent: torch.Tensor, k_rope: torch.Tensor,
                  mask: torch.Tensor | None, need_weights: bool,
                  scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over the latents: ``q_h . W_uk[h] c = (W_uk[h]^T q_h)
        . c``, and ``sum_j w_j W_uv[h] c_j = W_uv[h] sum_j w_j c_j``.
        Returns ``(B, H, Lq, D)`` and the weights."""
        w_uk = self.k_up.weight.unflatten(0, (self.num_heads, -1))
        w_uv = self.v_up.weight.unflatten(0, (self.num_heads, -1))
        # (B, H, Lq, D) @ (H, D, C) -> (B, H, Lq, C): keys' up-projection
        # moved to the query side
        q_latent = q @ w_uk
        queries = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, Lq, C+R)
        keys = torch.cat([latent, k_rope], dim=-1)  # (B, 1, Lk, C + R)
        # One key/value "head" of width C + R shared by all H heads:
        out, weights = self._attend(queries, keys, latent, mask,
                                    need_weights, scale)  # (B, H, Lq, C)
        # (B, H, Lq, C) @ (H, C, D) -> (B, H, Lq, D): values' up-projection
        return out @ w_uv.transpose(1, 2), weights

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, need_weights: bool, scale: float
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Explicit (weights returned) or fused attention of ``q``
        ``(B, H, Lq, E)`` over ``k`` ``(B, H|1, Lk, E)`` and ``v``."""
        if need_weights:
            return scaled_dot_product_attention(
                q, k, v, mask, self.attn_dropout, scale=scale)
        drop = self.attn_dropout
        dropout_p = drop.p if drop.training else 0.0
        if k.size(1) != q.size(1):  # one shared head: broadcast, no copy
            k = k.expand(-1, q.size(1), -1, -1)
            v = v.expand(-1, q.size(1), -1, -1)
        # Rows with nothing to attend to: zeros, as on the explicit path.
        out = fused_sdpa(q, k, v, mask, dropout_p, scale=scale)
        return out, None  # (B, H, Lq, Dv)

    def _check_inputs(self, x: torch.Tensor, mask: torch.Tensor | None,
                      need_weights: bool, is_causal: bool,
                      cache: KVCache | LayerCache | None, absorb: bool
                      ) -> LayerCache | None:
        check_tensor("x", x, ("B", "L", self.d_model))
        for name, flag in (("need_weights", need_weights),
                           ("is_causal", is_causal), ("absorb", absorb)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {flag!r}")
        layer = MultiHeadAttention._layer_cache(cache)
        q_len = x.size(1)
        k_len = q_len + (0 if layer is None else layer.kept)
        check_call_mask(mask, is_causal, layer, x.size(0), self.num_heads,
                        q_len, k_len, x)
        return layer

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"kv_latent_dim={self.kv_latent_dim}, "
                f"rope_dim={self.rope_dim}, head_dim={self.head_dim}")
