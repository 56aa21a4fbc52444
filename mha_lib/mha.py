"""The multi-head attention module the book builds (chapter 8).

Shape legend: B - batch, Lq/Lk - query/key length, H - heads, D - head dim,
d_model = H * D, H_kv - key/value heads (= H here; fewer in ``gqa``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib._checks import (
    check_device,
    check_dropout,
    check_dtype,
    check_flags,
    check_mask,
    check_module_dtype,
    check_positive_int,
    check_tensor,
    tracing,
)
from mha_lib.attention import scaled_dot_product_attention
from mha_lib.cache import KVCache, LayerCache, as_layer_cache
from mha_lib.heads import merge_heads, split_heads
from mha_lib.masks import causal_mask, sliding_window_mask

__all__ = ["MultiHeadAttention", "check_attention_mask"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with batch-first inputs ``(B, L, d_model)``.

    Four ``nn.Linear`` layers, ``q_proj``, ``k_proj``, ``v_proj`` and
    ``out_proj``, and an ``nn.Dropout`` on the attention weights,
    ``attn_dropout``. Both paths of :meth:`forward` call these modules, so
    hooks, wrapped or quantized layers act on either. Derived in chapter 8.

    Args:
        d_model: Width of every token vector, ``H * D``.
        num_heads: Number of heads ``H``; must divide ``d_model``.
        dropout: Probability of zeroing an attention weight in training.
        bias: Whether the four linear layers have biases.

    Example:
        >>> mha = MultiHeadAttention(d_model=8, num_heads=4)
        >>> x = torch.randn(3, 6, 8)  # (B, L, d_model)
        >>> mask = padding_mask(torch.tensor([6, 4, 2])) & causal_mask(6)
        >>> out, weights = mha(x, mask=mask)
        >>> out.shape, weights.shape  # (B, L, d_model), (B, H, Lq, Lk)
        (torch.Size([3, 6, 8]), torch.Size([3, 4, 6, 6]))
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        check_heads(d_model, num_heads, dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.num_kv_heads = num_heads  # fewer in GroupedQueryAttention
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    @property
    def dropout(self) -> float:
        """The dropout probability, read from ``attn_dropout``."""
        return self.attn_dropout.p

    @dropout.setter
    def dropout(self, p: float) -> None:
        self.attn_dropout.p = float(check_dropout("dropout", p))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
        *,
        is_causal: bool = False,
        cache: KVCache | LayerCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key`` and ``value``.

        Returns ``(output (B, Lq, d_model), weights (B, H, Lq, Lk) or
        None)``. A query with nothing to attend to gets a zero attention
        output (so the module returns ``out_proj``'s bias there), never NaN.

        Args:
            query: ``(B, Lq, d_model)``, in the dtype of the module's
                parameters (or under autocast).
            key: ``(B, Lk, d_model)``; defaults to ``query``
                (self-attention).
            value: ``(B, Lk, d_model)``; defaults to ``key``.
            mask: bool (True = may attend) or float (added to the scores),
                of shape ``(Lq, Lk)`` or ``(B|1, H|1, Lq|1, Lk)`` (``B|1``:
                ``B`` or 1, broadcast over the batch; ``H|1`` and ``Lq|1``
                likewise: :func:`~mha_lib.padding_mask` gives
                ``(B, 1, 1, Lk)``). The shapes and values it refuses are
                under Note.
            need_weights: True runs the explicit path derived in the book
                and returns the weights; False runs PyTorch's fused
                ``F.scaled_dot_product_attention`` and returns None for
                them. Both give the same output up to rounding. The fused
                kernel has no forward-mode AD (``torch.func.jvp``,
                ``jacfwd``) and no double backward (``create_graph=True``
                then a second backward): use True for those.
            is_causal: Each query attends only the keys up to its own
                position, aligned bottom-right (the last query sits at the
                last key; a query after ``L`` cached tokens sees those
                too); with a windowed cache, only the last ``window``
                positions. Combined with ``mask`` if both are given.
                PyTorch's SDPA and ``fused_sdpa(is_causal=True)`` align
                top-left instead; the two agree when ``Lq == Lk``.
            cache: For decoding (chapter 14): one layer of a
                :class:`~mha_lib.KVCache` (or a one-layer ``KVCache``). The
                new keys and values are appended and the queries attend to
                every kept position, so ``Lk`` in ``mask`` counts those
                too. A call with more than one new token needs ``mask`` or
                ``is_causal=True``.

        Note:
            A 3-D ``mask`` is refused: ``(B, Lq, Lk)`` and ``(H, Lq, Lk)``
            look alike. A 2-D mask is always ``(Lq, Lk)``: one row of keys
            per sequence, ``(B, Lk)``, is refused when ``B != Lq`` and read
            as ``(Lq, Lk)`` when ``B == Lq``; pass it as
            :func:`~mha_lib.padding_mask` gives it, ``(B, 1, 1, Lk)``. A
            float mask that has 1s and nothing but 0s and 1s is refused (it
            is almost surely a keep/drop mask: pass ``mask.bool()``; all
            zeros is fine), except where its values cannot be read: under
            ``torch.compile``, ``torch.export`` and ``torch.func.vmap`` it
            is added as given, with a ``UserWarning``.
        """
        key = query if key is None else key
        value = key if value is None else value
        layer = self._check_inputs(query, key, value, mask, need_weights,
                                   is_causal, cache)
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, Lq, D)
        # k and v: (B, H_kv, Lk, D)
        k = split_heads(self.k_proj(key), self.num_kv_heads)
        v = split_heads(self.v_proj(value), self.num_kv_heads)
        # Positions, cache and causal mask (chapters 14, 16, 17):
        q, k, v, mask, causal = self._in_sequence(q, k, v, mask, is_causal,
                                                  layer)
        if need_weights:  # the explicit path (chapter 6)
            if causal:
                mask = causal_mask(q.size(2), device=q.device)
            out, weights = self._explicit_attention(q, k, v, mask)
        else:  # PyTorch's fused kernel
            out = self._fused_attention(q, k, v, mask, causal)
            weights = None
        return self.out_proj(merge_heads(out)), weights  # (B, Lq, d_model)

    def _in_sequence(self, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, mask: torch.Tensor | None,
                     is_causal: bool, layer: LayerCache | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor | None, bool]:
        """Put the new tokens in their sequence: positions (chapter 16),
        the cache (chapter 14), the causal or sliding-window mask
        (chapters 7, 17). Returns ``q``, every kept key and value
        ``(B, H_kv, Lk, D)``, the mask, and whether the mask is the square
        causal one that ``F.scaled_dot_product_attention(is_causal=True)``
        applies itself (then the mask returned is None)."""
        past = 0 if layer is None else layer.length  # new tokens' offset
        q, k = self._positions(q, k, past)  # rotary subclasses (chapter 16)
        if layer is not None:  # decoding (chapter 14): append, see them all
            k, v = layer.update(k, v, owner=self)  # (B, H_kv, L + Lk, D)
        window = None if layer is None else layer.window
        # SDPA's own is_causal (top-left) is right only for a square mask.
        if is_causal and mask is None and window is None \
                and q.size(2) == k.size(2):
            return q, k, v, None, True
        if is_causal:
            mask = with_causal(mask, q.size(2), k.size(2), window, q.device)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)  # under autocast q may be narrower
        return q, k, v, mask, False

    def _positions(self, q: torch.Tensor, k: torch.Tensor, start: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where positions enter the queries ``(B, H, Lq, D)`` and the new
        keys ``(B, H_kv, Lk, D)``: nowhere here (the input already carries
        them, chapter 3); rotary attention rotates them (chapter 16),
        before the keys are cached. The keys are the tokens ``start,
        start + 1, ...`` and the queries the last ``Lq`` of them, aligned
        bottom-right as :func:`~mha_lib.causal_mask` aligns them."""
        return q, k

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, mask: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chapter 6's attention, one head per key/value head:
        ``(B, H, Lq, D)`` and weights ``(B, H, Lq, Lk)``.
        ``GroupedQueryAttention`` (chapter 14) overrides this."""
        return scaled_dot_product_attention(
            q, k, v, mask, self.attn_dropout)

    def _fused_attention(self, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, mask: torch.Tensor | None,
                         is_causal: bool) -> torch.Tensor:
        """The same attention on PyTorch's fused kernel: ``(B, H, Lq, D)``.
        Its dropout is ``attn_dropout``'s, applied inside the kernel."""
        dropout_p = kernel_dropout(self.attn_dropout)
        gqa = self.num_kv_heads != self.num_heads  # no copies of K and V
        return fused_kernel(q, k, v, mask, dropout_p, is_causal=is_causal,
                            enable_gqa=gqa)  # (B, H, Lq, D)

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, mask: torch.Tensor | None,
                      need_weights: bool, is_causal: bool,
                      cache: KVCache | LayerCache | None
                      ) -> LayerCache | None:
        """Shapes, dtypes and devices of the inputs (never the values inside
        them, but a float mask's, see ``forward``); returns the layer cache
        to use."""
        check_tensor("query", query, ("B", "Lq", self.d_model))
        batch = query.size(0)
        check_tensor("key", key, (batch, "Lk", self.d_model))
        check_tensor("value", value, (batch, key.size(1), self.d_model))
        check_module_dtype("query", query, self)
        for name, x in (("key", key), ("value", value)):
            check_dtype(name, x, query.dtype, "the query's")
            check_device(name, x, query.device, "the query's")
        check_flags(need_weights=need_weights, is_causal=is_causal)
        layer = as_layer_cache(cache)
        q_len = query.size(1)
        k_len = key.size(1) + (0 if layer is None else layer.kept)
        check_call_mask(mask, is_causal, layer, batch, self.num_heads,
                        q_len, k_len, query)
        return layer

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}")


def check_heads(d_model: int, num_heads: int, dropout: float) -> None:
    """``MultiHeadAttention``'s arguments: positive ``d_model`` and
    ``num_heads``, ``num_heads`` dividing ``d_model``, ``dropout`` in
    ``[0, 1)``."""
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    if d_model % num_heads:
        raise ValueError(f"num_heads: expected a divisor of "
                         f"d_model={d_model}, got num_heads={num_heads}")
    check_dropout("dropout", dropout)


def with_causal(mask: torch.Tensor | None, q_len: int, k_len: int,
                window: int | None, device: torch.device) -> torch.Tensor:
    """``mask`` restricted to the causal keys (the last ``window`` of them
    with a window), aligned bottom-right: ``(Lq, Lk)`` or
    ``(B|1, H|1, Lq, Lk)``."""
    if window is None:
        allowed = causal_mask(q_len, k_len, device)  # (Lq, Lk)
    else:
        allowed = sliding_window_mask(q_len, window, k_len, device)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed  # (B|1, H|1, Lq, Lk)
    return mask.masked_fill(~allowed, float("-inf"))


def kernel_dropout(dropout: nn.Module) -> float:
    """The probability a fused kernel applies for ``dropout``: its ``p`` in
    training, 0 in eval mode."""
    if not isinstance(dropout, nn.Dropout):
        raise TypeError(
            f"attn_dropout: the fused path (need_weights=False) hands "
            f"dropout to the kernel and needs an nn.Dropout, got "
            f"{type(dropout).__name__}; use need_weights=True to call it "
            f"as a module")
    return dropout.p if dropout.training else 0.0


def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None, dropout_p: float = 0.0, *,
               is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` ``(..., Lq, Dv)``, with zeros
    guaranteed on a query row that may attend nothing, as on the explicit
    path.

    PyTorch's kernels on the CPU give zeros there too since 2.5 (NaN
    before), but not every back end does: cuDNN's returned finite
    non-zero values on an H200 in float16 and bfloat16 with a mask, and
    the default dispatch's values matched it (the ``empty_rows`` section of
    :func:`mha_lib.gpu_record.recorded`). The library does not rely on
    any of them: on such a row the kernel may attend every key (finite
    numbers and gradients), and the row is zeroed afterwards.

    Args:
        q: Queries ``(..., Lq, E)``, as ``F.scaled_dot_product_attention``
            takes them.
        k: Keys ``(..., Lk, E)``.
        v: Values ``(..., Lk, Dv)``.
        mask: ``None``, bool (True = may attend) or float (added to the
            scores), broadcastable to ``(..., Lq, Lk)``.
        dropout_p: Dropout on the weights, inside the kernel.
        is_causal: As in ``F.scaled_dot_product_attention``: query ``i``
            sees keys ``0`` to ``i`` (top-left). With ``mask``, both apply.
            ``MultiHeadAttention.forward(is_causal=True)`` aligns
            bottom-right instead; the two agree when ``Lq == Lk``.
        scale: The factor of the scores; ``None``: ``1/sqrt(E)``.
        enable_gqa: Let ``k`` and ``v`` have fewer heads than ``q``.
    """
    if mask is not None and is_causal:  # both apply, as in F.sdpa
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool,
                            device=q.device).tril()  # top-left, (Lq, Lk)
        mask = (mask & causal if mask.dtype == torch.bool
                else mask.masked_fill(~causal, float("-inf")))
        is_causal = False
    if mask is None:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa)
    if mask.dtype == torch.bool:
        empty = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
        mask = mask | empty
    else:
        empty = (mask == float("-inf")).all(dim=-1, keepdim=True)
        mask = mask.masked_fill(empty, 0.0)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
        enable_gqa=enable_gqa)
    return out.masked_fill(empty, 0.0)  # (..., Lq, Dv)


_NO_HIGHER_ORDER = (
    "need_weights=False runs PyTorch's fused attention kernel, which has "
    "no {what}: use need_weights=True (the explicit path) for it")


def fused_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None, dropout_p: float = 0.0,
                 **options: object) -> torch.Tensor:
    """:func:`fused_sdpa` as the modules' fused path runs it: where the
    kernel lacks a derivative, forward-mode AD (``torch.func.jvp``,
    ``jacfwd``) or double backward, the error says so and names the way
    out, instead of naming the kernel's internals."""
    try:
        out = fused_sdpa(q, k, v, mask, dropout_p, **options)
    except NotImplementedError as error:
        raise NotImplementedError(
            _NO_HIGHER_ORDER.format(what="forward-mode AD")) from error
    if not tracing():
        for x in (q, k, v):
            if x.requires_grad:
                x.register_hook(_watch_second_backward)
    return out


def _watch_second_backward(grad: torch.Tensor) -> None:
    """A gradient the kernel's backward made: if it is differentiated in
    turn (``create_graph=True``, then a second backward), refuse clearly
    before PyTorch reaches the kernel's missing double backward."""
    if grad is not None and grad.requires_grad:
        grad.register_hook(_refuse_second_backward)


def _refuse_second_backward(grad: torch.Tensor) -> None:
    raise RuntimeError(_NO_HIGHER_ORDER.format(
        what="double backward (a gradient of a gradient)"))


def check_call_mask(mask: object, is_causal: bool,
                    layer: LayerCache | None, batch: int, num_heads: int,
                    q_len: int, k_len: int, query: torch.Tensor) -> None:
    """A module call's mask: :func:`check_attention_mask`, and a cached call
    with more than one new token needs ``mask`` or ``is_causal=True``
    (attending every key would let a new token see the ones after it)."""
    if (layer is not None and q_len > 1 and mask is None
            and not is_causal):
        raise ValueError(
            f"mask: expected is_causal=True (each new token sees the "
            f"cache and the new tokens up to itself) or a mask of "
            f"shape ({q_len}, {k_len}), got neither for a cached call "
            f"with {q_len} new tokens")
    if mask is not None:
        check_attention_mask(mask, batch, num_heads, q_len, k_len, query)


def check_attention_mask(mask: object, batch: int, num_heads: int,
                         q_len: int, k_len: int,
                         query: torch.Tensor) -> None:
    """A module's mask: bool or float in the query's dtype, on its device,
    of shape ``(Lq, Lk)`` or ``(B|1, H|1, Lq|1, Lk)``. 0-D, 1-D and 3-D
    masks are refused: a 3-D ``(B, Lq, Lk)`` and ``(H, Lq, Lk)`` look
    alike. A 2-D mask is ``(Lq, Lk)``: a ``(B, Lk)`` one (a row per
    sequence) is refused with a hint when ``B != Lq``, and read as
    ``(Lq, Lk)`` when ``B == Lq``.

    Args:
        mask: The mask to check.
        batch: ``B``, the query's batch size.
        num_heads: ``H``, the module's (query) heads.
        q_len: ``Lq``, the number of queries.
        k_len: ``Lk``, the number of keys, cached ones included.
        query: The module's query input (dtype and device).
    """
    if isinstance(mask, torch.Tensor) and mask.dim() == 3:
        raise ValueError(
            f"mask: expected (Lq, Lk) or (B|1, H|1, Lq, Lk), not 3-D "
            f"(is the first axis B or H?): pass mask[:, None] for one "
            f"mask per sequence, or mask[None] for one per head; got "
            f"shape {tuple(mask.shape)}")
    if isinstance(mask, torch.Tensor) and mask.dim() not in (2, 4):
        raise ValueError(
            f"mask: expected shape (Lq, Lk) = ({q_len}, {k_len}) or "
            f"(B|1, H|1, Lq, Lk); for one length per sequence pass "
            f"mha_lib.padding_mask(lengths), (B, 1, 1, Lk); got shape "
            f"{tuple(mask.shape)}")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 \
            and tuple(mask.shape) == (batch, k_len) and batch != q_len \
            and mask.size(0) != 1:
        raise ValueError(
            f"mask: expected a 2-D mask of shape (Lq, Lk) = ({q_len}, "
            f"{k_len}), got shape {tuple(mask.shape)}, which looks like "
            f"one row of keys per sequence, (B, Lk): pass it as "
            f"mask[:, None, None, :], (B, 1, 1, Lk), or build it with "
            f"mha_lib.padding_mask(lengths)")
    check_mask(mask, (batch, num_heads, q_len, k_len), "B H Lq Lk",
               query.dtype)
    check_device("mask", mask, query.device, "the query's")
