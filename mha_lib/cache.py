"""A key/value cache for decoding one token at a time (chapter 14).

Shape legend: B - batch, H_kv - key/value heads, L - cached positions,
D - head dim, N - new positions.

A decoder that has already seen ``L`` tokens keeps their keys and values;
a new token only computes its own and attends to all ``L + 1``. One pair of
tensors ``(B, H_kv, L, D)`` per layer; :meth:`KVCache.layer` hands one layer
to its attention module, whose ``forward(..., cache=...)`` calls ``update``.

The storage is allocated ahead and doubled when full, so a long decode
copies each position a constant number of times on average, instead of
``torch.cat``-ing the whole past at every step. With ``window`` set, only
the last ``window - 1`` positions are kept between calls (sliding-window
attention, chapter 17): a new token then sees exactly ``window`` keys, and
the memory stays flat however long the decode.
"""

from __future__ import annotations

import weakref

import torch

from mha_lib._checks import check_positive_int, check_tensor, shape_str

__all__ = ["KVCache", "LayerCache"]


class _Layer:
    """One layer's storage: ``keys[:, :, start:end]`` are the kept
    positions."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # (B, H_kv, capacity, D)
        self.values: torch.Tensor | None = None  # (B, H_kv, capacity, Dv)
        self.start = 0
        self.end = 0
        self.seen = 0  # positions ever appended (the next token's position)
        self.owner: weakref.ref | None = None  # the module that writes here

    @property
    def kept(self) -> int:
        return self.end - self.start


class KVCache:
    """Keys and values ``(B, H_kv, L, D)`` of every layer of a decoder.

    ``cache.layer(i)`` is layer ``i``'s part, to pass to that layer's
    attention module as ``cache=``; a module may take a one-layer
    ``KVCache`` whole. Each layer remembers the module that first wrote to
    it and refuses any other, so one cache cannot silently mix two
    modules' keys. Derived in chapter 14.

    Args:
        num_layers: How many attention layers the cache serves.
        window: Keep only the last ``window - 1`` positions between calls
            (sliding-window attention: with the next token, ``window``
            keys); ``None`` keeps every position.
        keep_graph: Keep the autograd graph of the cached keys and values
            (for backpropagating through a cached decode). By default they
            are detached: the cache holds numbers, not the graph that made
            them; the keys and values of the current call still get
            gradients.
    """

    def __init__(self, num_layers: int = 1, window: int | None = None,
                 keep_graph: bool = False):
        check_positive_int("num_layers", num_layers)
        if window is not None:
            check_positive_int("window", window)
        if not isinstance(keep_graph, bool):
            raise TypeError(f"keep_graph: expected a bool, "
                            f"got {keep_graph!r}")
        self.window = window
        self.keep_graph = keep_graph
        self._layers = [_Layer() for _ in range(num_layers)]

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def length(self) -> int:
        """Positions seen so far by layer 0, which is the position of the
        next token (with a ``window``, more than the positions kept)."""
        return self._layers[0].seen

    @property
    def kept(self) -> int:
        """Positions whose keys and values layer 0 holds now."""
        return self._layers[0].kept

    @property
    def keys(self) -> list[torch.Tensor | None]:
        """Each layer's kept keys ``(B, H_kv, L, D)``, or None if empty."""
        return [self._view(s.keys, s) for s in self._layers]

    @property
    def values(self) -> list[torch.Tensor | None]:
        """Each layer's kept values ``(B, H_kv, L, Dv)``, or None if
        empty."""
        return [self._view(s.values, s) for s in self._layers]

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values of every layer, what the cache
        must hold (the storage may be larger, see ``allocated_nbytes``)."""
        return sum(t.numel() * t.element_size()
                   for t in self.keys + self.values if t is not None)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes of the storage allocated for every layer, spare room
        included."""
        return sum(t.numel() * t.element_size() for s in self._layers
                   for t in (s.keys, s.values) if t is not None)

    def layer(self, index: int) -> LayerCache:
        """Layer ``index``'s part of the cache (what its module gets)."""
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < self.num_layers:
            raise ValueError(f"index: expected a layer in "
                             f"[0, {self.num_layers}), got {index!r}")
        return LayerCache(self, index)

    def reset(self) -> KVCache:
        """Forget every position and every layer's module; returns self."""
        self._layers = [_Layer() for _ in self._layers]
        return self

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int = 0,
               owner: object | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key`` ``(B, H_kv, N, D)`` and ``value``
        ``(B, H_kv, N, Dv)`` to layer ``layer``; return its kept keys and
        values followed by the new ones, ``(B, H_kv, L + N, D)`` and
        ``(B, H_kv, L + N, Dv)``.

        ``owner`` is the attention module calling (the first one to write a
        layer owns it; another one gets a ``ValueError``).
        """
        state = self._layers[self.layer(layer).index]
        self._claim(state, layer, owner)
        self._check_new(state, key, value)
        if self.keep_graph:  # the graph needs new tensors, not writes
            keys, values = self._concat(state, key, value)
        else:
            keys, values = self._write(state, key, value)
        state.seen += key.size(2)
        if self.window is not None and state.kept > self.window - 1:
            state.start = state.end - (self.window - 1)  # drop the oldest
        return keys, values

    # --- storage ---------------------------------------------------------

    @staticmethod
    def _view(storage: torch.Tensor | None, state: _Layer
              ) -> torch.Tensor | None:
        if storage is None or state.kept == 0:
            return None
        return storage[:, :, state.start:state.end]  # (B, H_kv, L, D)

    def _concat(self, state: _Layer, key: torch.Tensor, value: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``keep_graph=True``: new tensors each call, graph and all."""
        if state.keys is None:
            keys, values = key, value
        else:
            keys = torch.cat([self._view(state.keys, state), key], dim=2)
            values = torch.cat([self._view(state.values, state), value],
                               dim=2)  # (B, H_kv, L + N, D)
        state.keys, state.values = keys, values
        state.start, state.end = 0, keys.size(2)
        return keys, values

    def _write(self, state: _Layer, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the new positions into the storage (grown or compacted when
        full) and return views of it, or, when the new keys need gradients,
        the kept positions concatenated with them."""
        new = key.size(2)
        self._make_room(state, key, value, new)
        start, end = state.start, state.end  # (moved if compacted)
        state.keys.narrow(2, end, new).copy_(key.detach())
        state.values.narrow(2, end, new).copy_(value.detach())
        state.end = end + new
        if torch.is_grad_enabled() and (key.requires_grad
                                        or value.requires_grad):
            # Gradients flow to this call's keys and values, not the past.
            # The past keys (B, H_kv, L, D) and values (B, H_kv, L, Dv):
            past_k = state.keys.narrow(2, start, end - start)
            past_v = state.values.narrow(2, start, end - start)
            return (torch.cat([past_k, key], dim=2),
                    torch.cat([past_v, value], dim=2))  # (B, H_kv, L+N, D)
        return (state.keys.narrow(2, start, end - start + new),
                state.values.narrow(2, start, end - start + new))

    def _make_room(self, state: _Layer, key: torch.Tensor,
                   value: torch.Tensor, new: int) -> None:
        kept = state.kept
        if state.keys is not None and state.end + new <= state.keys.size(2):
            return
        need = kept + new
        if state.keys is not None and need <= state.keys.size(2) \
                and kept <= state.start:  # slide to the front, no overlap
            for storage in (state.keys, state.values):
                storage[:, :, :kept] = storage[:, :, state.start:state.end]
            state.start, state.end = 0, kept
            return
        old = state.keys.size(2) if state.keys is not None else 0
        capacity = max(need, 2 * old, 16)
        if self.window is not None:  # kept <= window - 1 between calls
            capacity = max(need, 2 * (self.window - 1) + new)
        keys = key.new_empty(*key.shape[:2], capacity, key.size(3))
        values = value.new_empty(*value.shape[:2], capacity, value.size(3))
        if kept:
            keys[:, :, :kept] = state.keys[:, :, state.start:state.end]
            values[:, :, :kept] = state.values[:, :, state.start:state.end]
        state.keys, state.values = keys, values
        state.start, state.end = 0, kept

    # --- checks ----------------------------------------------------------

    @staticmethod
    def _claim(state: _Layer, layer: int, owner: object | None) -> None:
        if owner is None:
            return
        current = state.owner() if state.owner is not None else None
        if current is None:
            state.owner = weakref.ref(owner)
        elif current is not owner:
            raise ValueError(
                f"cache: layer {layer} of this KVCache already holds the "
                f"keys of another module ({type(current).__name__}); give "
                f"each attention module its own layer, cache.layer(i), or "
                f"call cache.reset() to start over")

    @staticmethod
    def _check_new(state: _Layer, key: torch.Tensor, value: torch.Tensor
                   ) -> None:
        check_tensor("key", key, ("B", "H_kv", "N", "D"))
        check_tensor("value", value, (key.size(0), key.size(1), key.size(2),
                                      "Dv"))
        if value.dtype != key.dtype or value.device != key.device:
            raise ValueError(f"value: expected the key's dtype {key.dtype} "
                             f"and device {key.device}, got {value.dtype} "
                             f"on {value.device}")
        if state.keys is None or state.kept == 0 and state.seen == 0:
            return
        past_k, past_v = state.keys, state.values
        want = (past_k.size(0), past_k.size(1), "N", past_k.size(3))
        if (key.size(0), key.size(1), key.size(3)) != \
                (past_k.size(0), past_k.size(1), past_k.size(3)) \
                or value.size(3) != past_v.size(3) \
                or key.dtype != past_k.dtype or key.device != past_k.device:
            raise ValueError(
                f"key: expected shape {shape_str(want)}, dtype "
                f"{past_k.dtype} and device {past_k.device} (those in the "
                f"cache), got shape {shape_str(key.shape)}, dtype "
                f"{key.dtype} and device {key.device}")

    def __repr__(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return (f"KVCache(num_layers={self.num_layers}{window}, "
                f"length={self.length}, nbytes={self.nbytes})")


class LayerCache:
    """One layer of a :class:`KVCache`: ``update``, ``length``, ``kept``."""

    def __init__(self, cache: KVCache, index: int):
        self.cache = cache
        self.index = index

    @property
    def window(self) -> int | None:
        return self.cache.window

    @property
    def length(self) -> int:
        """Positions this layer has seen, the next token's position."""
        return self.cache._layers[self.index].seen

    @property
    def kept(self) -> int:
        """Positions whose keys and values this layer holds now."""
        return self.cache._layers[self.index].kept

    def update(self, key: torch.Tensor, value: torch.Tensor,
               owner: object | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`KVCache.update` on this layer."""
        return self.cache.update(key, value, self.index, owner)

    def __repr__(self) -> str:
        return (f"LayerCache(layer={self.index}, length={self.length}, "
                f"kept={self.kept})")
