"""Rotary position embeddings (RoPE) and the attention that uses them
(chapter 16).

Shape legend: B - batch, H - query heads, H_kv - key/value heads,
L - length, D - head dim (even), D/2 - rotated pairs.

Instead of adding a position vector to the input (chapter 3), RoPE rotates
each query and key by an angle proportional to its position: pair ``i`` of
a vector at position ``m`` turns by ``m * theta_i`` with
``theta_i = base ** (-2 i / D)``. A rotation by ``m`` then one by ``n``
meet in the dot product as a single rotation by ``n - m``, so the score of
query ``m`` and key ``n`` depends on their positions only through
``m - n``.
"""

from __future__ import annotations

import torch

from mha_lib._checks import check_base, check_tensor
from mha_lib.gqa import GroupedQueryAttention

__all__ = ["apply_rotary", "RotaryAttention", "rotary_angles"]


def rotary_angles(positions: torch.Tensor, dim: int,
                  base: float = 10000.0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The angles ``positions[l] * base ** (-2 i / dim)``, ``(L, D/2)``, in
    ``dtype``: float64 (as :func:`~mha_lib.apply_rotary` computes them)
    keeps them exact at any position, float32 rounds positions from
    ``2**24`` on.

    Args:
        positions: The tokens' positions, ``(L,)``, integers.
        dim: The width ``D`` of the rotated vectors (even): ``D/2`` pairs.
        base: The base of the speeds; Llama 3 uses ``500000``.
        dtype: The dtype of the computation and of the result.
    """
    # theta_i = base^(-2i/D), i = 0 .. D/2 - 1:
    exponents = torch.arange(0, dim, 2, device=positions.device,
                             dtype=dtype) / dim  # (D/2,)
    inv_freq = base ** -exponents  # (D/2,)
    return positions.to(dtype)[:, None] * inv_freq[None, :]  # (L, D/2)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor,
                 base: float = 10000.0,
                 interleaved: bool = False) -> torch.Tensor:
    """Rotate the pairs of features of ``x`` ``(..., L, D)`` by their
    positions' angles; returns a tensor of the same shape and dtype.

    Pair ``i`` of the token at ``positions[l]`` turns by
    ``positions[l] * base ** (-2 i / D)``. With ``interleaved=False`` (the
    "rotate half" layout of GPT-NeoX and Llama code) pair ``i`` is features
    ``(i, i + D/2)``; with ``interleaved=True`` (the RoFormer paper's
    layout) it is ``(2i, 2i + 1)``. The angles are computed in float64,
    exact for any position (in float32, positions from ``2**24`` on would
    round to each other, and late angles lose their fraction), and the
    rotation in float32 (float64 for float64 ``x``). On a device without
    float64 (Apple's MPS) the angles are float32: their error grows as the
    position times about ``6e-8`` radians, and from ``2**24`` on
    neighbouring positions share an angle.
    Derived in chapter 16.

    Args:
        x: Queries or keys ``(..., L, D)``, ``D`` even, floating point.
        positions: Integer positions ``(L,)`` of the ``L`` tokens, on
            ``x``'s device.
        base: The base of the angle frequencies (10000 in the paper).
        interleaved: The pair layout: adjacent features (True) or the two
            halves (False).

    Example:
        >>> x = torch.randn(1, 2, 6, 4)  # (B, H, L, D)
        >>> rotated = apply_rotary(x, positions=torch.arange(6))
        >>> torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1))  # rotation
        True
    """
    _check_inputs(x, positions, base, interleaved)
    # float64 angles: a float32 position or angle rounds late positions.
    exact = torch.float32 if x.device.type == "mps" else torch.float64
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    angles = rotary_angles(positions, x.size(-1), base, exact)  # (L, D/2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)  # (L, D/2)
    xf = x.to(dtype)
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]  # (..., L, D/2) each
    else:
        x1, x2 = xf.chunk(2, dim=-1)  # (..., L, D/2) each
    r1 = x1 * cos - x2 * sin  # (..., L, D/2)
    r2 = x1 * sin + x2 * cos  # (..., L, D/2)
    if interleaved:
        out = torch.stack([r1, r2], dim=-1).flatten(-2)  # (..., L, D)
    else:
        out = torch.cat([r1, r2], dim=-1)  # (..., L, D)
    return out.to(x.dtype)


def _check_inputs(x: object, positions: object, base: object,
                  interleaved: object) -> None:
    """``apply_rotary``'s arguments: shapes, dtypes, devices, options."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor (..., L, D), "
                        f"got {type(x).__name__}")
    if x.dim() < 2 or x.size(-1) % 2:
        raise ValueError(f"x: expected shape (..., L, D) with D even, "
                         f"got shape {tuple(x.shape)}")
    check_tensor("x", x, [None] * x.dim())
    check_tensor("positions", positions, ("L",), floating=False)
    if positions.is_floating_point() or positions.is_complex() \
            or positions.dtype == torch.bool:
        raise TypeError(f"positions: expected an integer tensor, "
                        f"got dtype {positions.dtype}")
    if positions.size(0) != x.size(-2):
        raise ValueError(f"positions: expected shape (L,) = "
                         f"({x.size(-2)},), one per token of x, got shape "
                         f"{tuple(positions.shape)}")
    if positions.device != x.device:
        raise ValueError(f"positions: expected a tensor on {x.device} "
                         f"(x's), got one on {positions.device}")
    _check_options(base, interleaved)


def _check_options(base: object, interleaved: object) -> None:
    check_base("base", base)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, "
                        f"got {interleaved!r}")


class RotaryAttention(GroupedQueryAttention):
    """Multi-head (or grouped-query) attention with rotary positions:
    queries and keys are rotated by :func:`apply_rotary` after the
    projections, keys before they enter a :class:`~mha_lib.KVCache`.

    ``forward`` is :class:`~mha_lib.MultiHeadAttention`'s (same arguments,
    same ``(output, weights | None)``); only the hook ``_positions``
    differs. Key ``t`` of a call is at position ``cache length + t``, so
    decoding with a cache gives the full causal forward; the queries are
    the last ``Lq`` of those positions, aligned bottom-right as
    ``is_causal`` and :func:`~mha_lib.causal_mask` align them (so
    ``m(x[:, -1:], x, x, is_causal=True)`` is the last row of
    ``m(x, is_causal=True)``). The input carries no position vector:
    nothing is added to the embeddings. Derived in chapter 16.

    Args:
        d_model: Width of every token vector, ``H * D``.
        num_heads: Number of query heads ``H``; must divide ``d_model``.
        num_kv_heads: Number of key/value heads ``H_kv`` (must divide
            ``num_heads``); ``None`` gives ``num_heads`` (multi-head).
        dropout: Probability of zeroing an attention weight in training.
        bias: Whether the four linear layers have biases.
        base: The base of the rotary frequencies (10000 in the paper).
        interleaved: The pair layout of :func:`apply_rotary`.

    Example:
        >>> attention = RotaryAttention(d_model=16, num_heads=4)
        >>> out, _ = attention(torch.randn(2, 6, 16), is_causal=True)
        >>> out.shape
        torch.Size([2, 6, 16])
    """

    def __init__(self, d_model: int, num_heads: int,
                 num_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, base: float = 10000.0,
                 interleaved: bool = False):
        kv = num_heads if num_kv_heads is None else num_kv_heads
        super().__init__(d_model, num_heads, kv, dropout, bias)
        if self.head_dim % 2:
            raise ValueError(f"num_heads: expected head_dim = d_model / "
                             f"num_heads even (rotary pairs), got "
                             f"head_dim={self.head_dim}")
        _check_options(base, interleaved)
        self.base = float(base)
        self.interleaved = interleaved

    def _positions(self, q: torch.Tensor, k: torch.Tensor, start: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``k`` ``(B, H_kv, Lk, D)``, the tokens ``start, start + 1,
        ...``, and ``q`` ``(B, H, Lq, D)``, the last ``Lq`` of them."""
        end = start + k.size(2)  # one past the last key's position
        q_pos = torch.arange(end - q.size(2), end, device=q.device)  # (Lq,)
        k_pos = torch.arange(start, end, device=k.device)  # (Lk,)
        return (apply_rotary(q, q_pos, self.base, self.interleaved),
                apply_rotary(k, k_pos, self.base, self.interleaved))

    def extra_repr(self) -> str:
        return (super().extra_repr()
                + f", base={self.base}, interleaved={self.interleaved}")
