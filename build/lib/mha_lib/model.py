"""A tiny decoder-only transformer built from the library's transformer
blocks (chapters 14, 15).

Shape legend: B - batch, L - length (new tokens), H - heads, Lk - key
length (cached + new), N - layers, V - vocabulary size.

``decode_speed`` times greedy decoding with and without the key/value
cache; from a shell: ``python -m mha_lib.decode_bench``.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from mha_lib._checks import check_positive_int, check_tensor, tracing
from mha_lib.block import TransformerBlock
from mha_lib.cache import KVCache

__all__ = ["TinyTransformer", "decode_speed"]


class TinyTransformer(nn.Module):
    """Decoder-only language model: token + learned position embeddings,
    ``num_layers`` pre-norm blocks (:class:`~mha_lib.TransformerBlock`,
    GELU, ``d_ff = 4 * d_model`` unless given), a final LayerNorm and a
    linear head to ``vocab_size`` logits.

    ``forward(idx (B, L), cache=None, need_weights=False)`` returns logits
    ``(B, L, V)``, and with ``need_weights=True`` also the attention weights
    ``(N, B, H, L, Lk)``. ``generate`` decodes greedily. Chapters 14 and 15.

    Args:
        vocab_size: Number of token ids ``V``.
        d_model: Width of every token vector.
        num_heads: Attention heads per block.
        num_layers: Number of blocks ``N``.
        max_len: Most positions a sequence (cached ones included) may have.
        num_kv_heads: None for :class:`~mha_lib.MultiHeadAttention`, else
            :class:`~mha_lib.GroupedQueryAttention` with this many
            key/value heads.
        d_ff: Hidden width of each feed-forward network; None for
            ``4 * d_model``.
        dropout: Dropout probability of every block.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = TinyTransformer(vocab_size=10, d_model=16, num_heads=4,
        ...                         num_layers=2, max_len=32).eval()
        >>> prompt = torch.tensor([[1, 2, 3]])  # (B, L) token ids
        >>> cached = model.generate(prompt, max_new_tokens=5)
        >>> cached.shape
        torch.Size([1, 8])
        >>> torch.equal(cached, model.generate(prompt, 5, use_cache=False))
        True
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int,
                 num_layers: int, max_len: int,
                 num_kv_heads: int | None = None, *,
                 d_ff: int | None = None, dropout: float = 0.0):
        super().__init__()
        for name, value in (("vocab_size", vocab_size),
                            ("num_layers", num_layers),
                            ("max_len", max_len)):
            check_positive_int(name, value)
        self.vocab_size, self.max_len = vocab_size, max_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, dropout,
                             num_kv_heads=num_kv_heads)
            for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def new_cache(self) -> KVCache:
        """An empty :class:`~mha_lib.KVCache` with one slot per block."""
        return KVCache(len(self.blocks))

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(B, L, V)`` for token ids ``idx`` ``(B, L)``, and with
        ``need_weights=True`` also every block's attention weights
        ``(N, B, H, L, Lk)``.

        Args:
            idx: Token ids ``(B, L)``, integers in ``[0, vocab_size)``.
            cache: A :class:`~mha_lib.KVCache` from :meth:`new_cache`: the
                ids continue the sequence it holds (chapter 14).
            need_weights: Also return the attention weights (the explicit
                path of every block's attention).
        """
        _check_ids(idx)
        # Reading the ids' values breaks a compiled graph: eager calls only.
        if not tracing() and idx.numel() and not (
                0 <= int(idx.min()) <= int(idx.max()) < self.vocab_size):
            raise ValueError(
                f"idx: expected token ids in [0, vocab_size="
                f"{self.vocab_size}), got ids from {int(idx.min())} to "
                f"{int(idx.max())}")
        if cache is not None and (
                not isinstance(cache, KVCache)
                or cache.num_layers != len(self.blocks)):
            raise ValueError(
                f"cache: expected a KVCache with num_layers="
                f"{len(self.blocks)} (model.new_cache()), got {cache!r}")
        past = 0 if cache is None else cache.length
        length = idx.size(1)
        if past + length > self.max_len:
            raise ValueError(
                f"idx: expected at most max_len={self.max_len} positions, "
                f"got {past} cached + {length} new = {past + length}")
        positions = torch.arange(past, past + length,
                                 device=idx.device)  # (L,)
        x = self.tok_emb(idx) + self.pos_emb(positions)  # (B, L, d_model)
        # Causal, aligned bottom-right: query i is position past + i. A
        # single new token may see every cached one: no mask at all.
        all_weights = []
        for i, block in enumerate(self.blocks):
            layer = None if cache is None else cache.layer(i)
            x, weights = block(x, need_weights=need_weights,
                               is_causal=length > 1,
                               cache=layer)  # (B, L, d_model)
            all_weights.append(weights)
        logits = self.head(self.ln_f(x))  # (B, L, V)
        if need_weights:
            return logits, torch.stack(all_weights)  # (N, B, H, L, Lk)
        return logits

    def generate(self, idx: torch.Tensor, max_new_tokens: int,
                 use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding: append ``max_new_tokens`` argmax tokens to
        ``idx`` ``(B, L)``; returns ``(B, L + max_new_tokens)``.

        Runs in inference mode and in eval mode (no dropout, whatever the
        model's mode: a model in training mode is switched to eval for the
        call and back after it), and returns an ordinary tensor.

        Args:
            idx: The prompts ``(B, L)``, at least one token each.
            max_new_tokens: How many tokens to append.
            use_cache: True feeds the prompt once, then one token per step,
                with a :class:`~mha_lib.KVCache`; False re-runs the whole
                sequence every step. Both give the same tokens.
        """
        _check_ids(idx)
        if idx.size(1) == 0:
            raise ValueError(
                f"idx: expected a prompt of at least one token, got shape "
                f"{tuple(idx.shape)} (greedy decoding predicts from the "
                f"last token)")
        if isinstance(max_new_tokens, bool) \
                or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: expected a non-negative "
                             f"int, got {max_new_tokens!r}")
        if idx.size(1) + max_new_tokens > self.max_len:
            raise ValueError(
                f"max_new_tokens: expected the prompt ({idx.size(1)} "
                f"tokens) plus max_new_tokens to fit max_len="
                f"{self.max_len}, got {idx.size(1)} + {max_new_tokens} = "
                f"{idx.size(1) + max_new_tokens}")
        # Inference mode skips autograd's bookkeeping on every small op; the
        # ids go back out as an ordinary tensor (clone) that training can
        # use.
        # Dropout would make each step (and the cached and uncached
        # decodes) random: eval mode for the call, the caller's mode after.
        modes = {m: m.training for m in self.modules()}
        self.eval()
        try:
            with torch.inference_mode():
                cache = self.new_cache() if use_cache else None
                logits = self(idx, cache=cache)  # (B, L, V)
                for step in range(max_new_tokens):
                    next_id = logits[:, -1].argmax(dim=-1,
                                                   keepdim=True)  # (B, 1)
                    idx = torch.cat([idx, next_id], dim=1)  # (B, L + 1)
                    if step + 1 < max_new_tokens:
                        logits = (self(next_id, cache=cache) if use_cache
                                  else self(idx))  # (B, 1 or L, V)
        finally:
            for m, training in modes.items():
                m.training = training
        return idx.clone()


def _check_ids(idx: object) -> None:
    check_tensor("idx", idx, ("B", "L"), floating=False)
    if idx.dtype.is_floating_point or idx.dtype.is_complex \
            or idx.dtype == torch.bool:
        raise TypeError(f"idx: expected integer token ids, "
                        f"got dtype {idx.dtype}")


def decode_speed(model: TinyTransformer, prompt: torch.Tensor,
                 max_new_tokens: int, rounds: int = 3
                 ) -> dict[str, float | bool]:
    """Median wall time (ms) of ``model.generate`` with and without the
    cache, their ratio ``speedup``, and ``same_tokens``: whether both
    decoded the same tokens."""
    check_positive_int("rounds", rounds)
    was_training = model.training
    model.eval()
    times: dict[bool, list[float]] = {True: [], False: []}
    tokens = {}
    for r in range(rounds + 1):  # round 0 warms up
        for use_cache in (r % 2 == 0, r % 2 == 1):  # alternate the order
            start = time.perf_counter()
            tokens[use_cache] = model.generate(prompt, max_new_tokens,
                                               use_cache=use_cache)
            if r:
                times[use_cache].append(
                    (time.perf_counter() - start) * 1e3)
    model.train(was_training)
    cached = sorted(times[True])[rounds // 2]
    uncached = sorted(times[False])[rounds // 2]
    return {"cached_ms": cached, "uncached_ms": uncached,
            "speedup": uncached / cached,
            "same_tokens": bool(torch.equal(tokens[True], tokens[False]))}
