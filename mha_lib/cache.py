"""A key/value cache for decoding one token at a time (chapter 14).

Shape legend: B - batch, H_kv - key/value heads, L - cached positions, D - head dim.

A decoder that has already seen ``L`` tokens keeps their keys and values; a new token
only computes its own and attends to all ``L + 1``. One pair of tensors
``(B, H_kv, L, D)`` per layer; :meth:`KVCache.layer` hands one layer to its attention
module, whose ``forward(..., cache=...)`` calls ``update``.
"""

from __future__ import annotations

import torch

from mha_lib._checks import check_positive_int, check_tensor, shape_str

__all__ = ["KVCache", "LayerCache"]


class KVCache:
    """Keys and values ``(B, H_kv, L, D)`` of every layer, grown by :meth:`update`.

    ``KVCache(num_layers)``; ``cache.layer(i)`` is layer ``i``'s part, to pass to an
    attention module as ``cache=``; a single module may take the whole cache (layer 0).
    ``length`` is the number of cached positions, ``nbytes`` the memory held.
    Derived in chapter 14.
    """

    def __init__(self, num_layers: int = 1):
        check_positive_int("num_layers", num_layers)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def length(self) -> int:
        """Cached positions (of layer 0; every layer has as many after a full forward)."""
        return self.layer_length(0)

    def layer_length(self, layer: int) -> int:
        keys = self.keys[layer]
        return 0 if keys is None else keys.size(2)

    @property
    def nbytes(self) -> int:
        """Bytes held by all cached keys and values."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)

    def layer(self, index: int) -> LayerCache:
        """Layer ``index``'s part of the cache (what its attention module gets)."""
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < self.num_layers:
            raise ValueError(f"index: expected a layer in [0, {self.num_layers}), got {index!r}")
        return LayerCache(self, index)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``, ``value`` ``(B, H_kv, L_new, D)`` to layer ``layer``; return
        all its keys and values ``(B, H_kv, L + L_new, D)``."""
        check_tensor("key", key, ("B", "H_kv", "L_new", "D"))
        check_tensor("value", value, tuple(key.shape))
        past = self.keys[layer]
        if past is None:
            self.keys[layer], self.values[layer] = key, value
        else:
            expected = (past.size(0), past.size(1), "L_new", past.size(3))
            if (key.size(0), key.size(1), key.size(3)) != (past.size(0), past.size(1),
                                                           past.size(3)) \
                    or key.dtype != past.dtype:
                raise ValueError(f"key: expected shape {shape_str(expected)} and dtype "
                                 f"{past.dtype} (those in the cache), got shape "
                                 f"{shape_str(key.shape)} and dtype {key.dtype}")
            self.keys[layer] = torch.cat([past, key], dim=2)  # (B, H_kv, L + L_new, D)
            self.values[layer] = torch.cat([self.values[layer], value], dim=2)
        return self.keys[layer], self.values[layer]

    def __repr__(self) -> str:
        return f"KVCache(num_layers={self.num_layers}, length={self.length}, nbytes={self.nbytes})"


class LayerCache:
    """One layer of a :class:`KVCache`: ``update(key, value)`` and ``length``."""

    def __init__(self, cache: KVCache, index: int):
        self.cache = cache
        self.index = index

    @property
    def length(self) -> int:
        return self.cache.layer_length(self.index)

    def update(self, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(key, value, self.index)

    def __repr__(self) -> str:
        return f"LayerCache(layer={self.index}, length={self.length})"
