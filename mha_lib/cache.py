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
the memory stays flat however long the decode: the storage holds the window
and an eighth of it more (in position order, so the keys it returns are
contiguous), and slides the kept positions to the front when full, about
8 positions copied per decoded token.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from mha_lib._checks import check_positive_int, check_tensor, shape_str

__all__ = ["KVCache", "LayerCache", "as_layer_cache", "writer_id"]

T = TypeVar("T")

_WRITER_ID = "_kv_cache_writer_id"


def writer_id(module: object) -> str:
    """The id a cache knows ``module`` by: made the first time the module
    writes to a cache and kept in its ``__dict__``, so copies of the module
    (``copy.deepcopy``, ``pickle``, ``torch.save``) carry it, and a new
    module (even one built again from the same code) has another."""
    state = vars(module)
    if _WRITER_ID not in state:
        state[_WRITER_ID] = uuid.uuid4().hex
    return state[_WRITER_ID]


class _Layer:
    """One layer's storage: ``keys[:, :, start:end]`` are the kept
    positions."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # (B, H_kv, capacity, D)
        self.values: torch.Tensor | None = None  # (B, H_kv, capacity, Dv)
        self.start = 0
        self.end = 0
        self.seen = 0  # positions ever appended (the next token's position)
        self.owner: str | None = None  # writer_id of the writing module
        self.owner_name = ""  # its class, for messages
        # What the owner derived once from its weights for this cache
        # (LayerCache.derived): per layer, not per sequence.
        self.derived: dict[str, object] = {}

    @property
    def kept(self) -> int:
        return self.end - self.start


class ReadOnlyLayers(tuple):
    """``KVCache.keys`` and ``.values``: one tensor (or None) per layer,
    as a tuple that says how to change the cache when assigned to."""

    def __setitem__(self, index: object, value: object) -> None:
        raise TypeError("cache.keys and cache.values are read-only views "
                        "of the cache: use cache.reorder(indices) to pick "
                        "or repeat sequences (beam search), cache.reset() "
                        "to start over, or update() to append")


class KVCache:
    """Keys and values ``(B, H_kv, L, D)`` of every layer of a decoder.

    ``cache.layer(i)`` is layer ``i``'s part, to pass to that layer's
    attention module as ``cache=``; a module may take a one-layer
    ``KVCache`` whole. Derived in chapter 14.

    Args:
        num_layers: How many attention layers the cache serves.
        window: Keep only the last ``window - 1`` positions between calls
            (sliding-window attention: with the next token, ``window``
            keys); ``None`` keeps every position.
        keep_graph: Keep the autograd graph of the cached keys and values
            (for backpropagating through a cached decode into the layers
            that made past keys). By default they are detached: the cache
            holds numbers, not the graph that made them; the keys and
            values of the current call still get gradients, and so do the
            queries of every call (training ``q_proj`` through a cached
            decode needs no ``keep_graph``). With gradients enabled each
            call returns new tensors; under ``torch.no_grad`` or
            ``torch.inference_mode`` (decoding for speed), views of the
            storage.

    Example:
        >>> attention = MultiHeadAttention(8, 4).eval()
        >>> x = torch.randn(1, 5, 8)  # 5 tokens
        >>> cache = KVCache()
        >>> with torch.no_grad():
        ...     _ = attention(x[:, :4], is_causal=True, cache=cache)
        ...     last, _ = attention(x[:, 4:], cache=cache)  # token 5
        ...     full, _ = attention(x, is_causal=True)  # no cache
        >>> cache.length, torch.allclose(last, full[:, 4:], atol=1e-6)
        (5, True)

    Note:
        Each layer remembers the module that first wrote to it and refuses
        any other, so one cache cannot silently mix two modules' keys. The
        module is remembered by an id it carries
        (``mha_lib.cache.writer_id``), not by a reference: a module built
        anew (a notebook cell run again) is another module, while a copy of
        the writer (``copy.deepcopy((model, cache))``, ``pickle``,
        ``torch.save``) is the same one and may go on. A cache pickles and
        deep-copies with its contents, and ``torch.load(path,
        weights_only=True)`` reads a saved one inside
        ``torch.serialization.safe_globals([KVCache])``.
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
        """How many layers the cache holds, one per attention layer."""
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
    def keys(self) -> Sequence[torch.Tensor | None]:
        """Each layer's kept keys ``(B, H_kv, L, D)``, or None if empty, in
        a read-only tuple of views of the storage (see ``reorder``)."""
        return ReadOnlyLayers(self._view(s.keys, s) for s in self._layers)

    @property
    def values(self) -> Sequence[torch.Tensor | None]:
        """Each layer's kept values ``(B, H_kv, L, Dv)``, or None if
        empty, in a read-only tuple of views of the storage."""
        return ReadOnlyLayers(self._view(s.values, s)
                              for s in self._layers)

    @property
    def batch_size(self) -> int | None:
        """How many sequences the cache holds (None before the first
        update)."""
        state = self._layers[0]
        return None if state.keys is None else state.keys.size(0)

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
        """Layer ``index``'s part of the cache (what its module gets).

        Args:
            index: The layer, from ``0`` to ``num_layers - 1``.
        """
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < self.num_layers:
            raise ValueError(f"index: expected a layer in "
                             f"[0, {self.num_layers}), got {index!r}")
        return LayerCache(self, index)

    def reset(self) -> KVCache:
        """Forget every position and every layer's module; returns self."""
        self._layers = [_Layer() for _ in self._layers]
        return self

    def reorder(self, indices: torch.Tensor) -> KVCache:
        """Keep the sequences ``indices`` ``(B_new,)`` of the batch, in that
        order, in every layer: sequence ``i`` of the reordered cache is
        sequence ``indices[i]`` of this one. Beam search calls it after each
        step with the beams it keeps (an index may repeat; ``B_new`` may
        differ from ``B``). Returns self.

        Args:
            indices: Integer indices into the batch, on the cache's device.
        """
        check_tensor("indices", indices, ("B_new",), floating=False)
        if indices.is_floating_point() or indices.is_complex() \
                or indices.dtype == torch.bool:
            raise TypeError(f"indices: expected an integer tensor, "
                            f"got dtype {indices.dtype}")
        batch = self.batch_size
        if batch is not None and indices.numel() and (
                int(indices.min()) < 0 or int(indices.max()) >= batch):
            raise ValueError(
                f"indices: expected indices into the cache's batch of "
                f"{batch} sequences, in [0, {batch}), got values from "
                f"{int(indices.min())} to {int(indices.max())}")
        for state in self._layers:
            if state.keys is not None:
                state.keys = state.keys.index_select(
                    0, indices.to(state.keys.device))  # (B_new, H_kv, ...)
                state.values = state.values.index_select(
                    0, indices.to(state.values.device))
        return self

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int = 0,
               owner: object | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key`` ``(B, H_kv, N, D)`` and ``value``
        ``(B, H_kv, N, Dv)`` to layer ``layer``; return its kept keys and
        values followed by the new ones, ``(B, H_kv, L + N, D)`` and
        ``(B, H_kv, L + N, Dv)``.

        An attention module calls it in its ``forward`` with the keys and
        values of the new positions, then attends over what it returns.

        Args:
            key: The new keys ``(B, H_kv, N, D)``; ``B``, ``H_kv`` and
                ``D`` as in the layer's earlier calls.
            value: The new values ``(B, H_kv, N, Dv)``.
            layer: Which layer's part to append to, from ``0`` to
                ``num_layers - 1``.
            owner: The attention module calling. The first module to
                write a layer owns it: later calls from it (or a copy of
                it) go on, another module gets a ``ValueError``, so one
                cache cannot silently mix two modules' keys. ``None``
                skips the check.
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
        if torch.is_grad_enabled():
            # New tensors: autograd may keep what we return for the
            # backward pass (to differentiate the queries, say), and the
            # next call writes into the storage. Gradients flow to this
            # call's keys and values, not the past ones.
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
        shift = state.start
        if state.keys is not None and need <= state.keys.size(2) and shift:
            # Slide the kept positions to the front, in pieces no longer
            # than the shift, so that no piece overlaps its own source.
            for first in range(0, kept, shift):
                size = min(shift, kept - first)
                for storage in (state.keys, state.values):
                    storage.narrow(2, first, size).copy_(
                        storage.narrow(2, shift + first, size))
            state.start, state.end = 0, kept
            return
        old = state.keys.size(2) if state.keys is not None else 0
        capacity = max(need, 2 * old, 16)
        if self.window is not None:  # kept <= window - 1 between calls
            # Room for the kept window and an eighth of it more: a slide
            # every (window - 1) / 8 steps copies about 8 positions per
            # decoded token, and the storage stays near 1.125 window.
            spare = max(new, -(-(self.window - 1) // 8))
            capacity = max(need, self.window - 1 + spare)
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
        writer = writer_id(owner)
        if state.owner is None:
            state.owner, state.owner_name = writer, type(owner).__name__
        elif state.owner != writer:
            raise ValueError(
                f"cache: layer {layer} of this KVCache already holds the "
                f"keys of another module (a {state.owner_name}), which "
                f"only it or a copy of it may go on; give each attention "
                f"module its own layer, cache.layer(i), or call "
                f"cache.reset() to start over")

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
        if key.size(0) != past_k.size(0):
            raise ValueError(
                f"cache: holds a batch of {past_k.size(0)} sequences, got "
                f"a call with a batch of {key.size(0)}; use a new KVCache "
                f"(or cache.reset()) for another batch, or "
                f"cache.reorder(indices) to pick or repeat sequences")
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

    def __getstate__(self) -> dict:
        """Plain data, tensors, numbers and strings, for pickle, deepcopy
        and ``torch.load(weights_only=True)`` (which then needs to allow
        only ``KVCache`` itself)."""
        state = dict(vars(self))
        state["_layers"] = [dict(vars(s)) for s in self._layers]
        return state

    def __setstate__(self, state: dict) -> None:
        layers = []
        for fields in state["_layers"]:
            layer = _Layer()
            vars(layer).update(fields)
            layers.append(layer)
        vars(self).update(state)
        self._layers = layers

    def __repr__(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return (f"KVCache(num_layers={self.num_layers}{window}, "
                f"length={self.length}, nbytes={self.nbytes})")


def as_layer_cache(cache: object) -> LayerCache | None:
    """A module's ``cache=`` argument as one layer: a :class:`LayerCache`
    as it is, a one-layer :class:`KVCache` as its layer 0, None as None.

    Args:
        cache: What the module was given as ``cache=``: None, a
            ``LayerCache`` or a one-layer ``KVCache`` (a ``KVCache`` of
            more layers raises ``ValueError``, anything else
            ``TypeError``).
    """
    if cache is None or isinstance(cache, LayerCache):
        return cache
    if isinstance(cache, KVCache):
        if cache.num_layers != 1:
            raise ValueError(
                f"cache: expected one layer's cache, cache.layer(i) for "
                f"the module of layer i (or a KVCache(num_layers=1)), got "
                f"a KVCache with {cache.num_layers} layers")
        return cache.layer(0)
    raise TypeError(f"cache: expected a KVCache or one of its layers, "
                    f"got {type(cache).__name__}")


class LayerCache:
    """One layer of a :class:`KVCache`: ``update``, ``length``, ``kept``,
    ``derived``. ``cache.layer(i)`` makes it; an attention module takes
    it as ``cache=`` and sees that layer only.

    Args:
        cache: The cache it is a view of (it holds no tensors itself).
        index: Its layer in ``cache``, from ``0`` to
            ``cache.num_layers - 1``.
    """

    def __init__(self, cache: KVCache, index: int):
        self.cache = cache
        self.index = index

    @property
    def window(self) -> int | None:
        """The cache's ``window``; ``None`` keeps every position."""
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
        """:meth:`~mha_lib.KVCache.update` on this layer: append and
        return its keys and values.

        Args:
            key: The new keys ``(B, H_kv, N, D)``.
            value: The new values ``(B, H_kv, N, Dv)``.
            owner: The attention module calling (see
                :meth:`~mha_lib.KVCache.update`).
        """
        return self.cache.update(key, value, self.index, owner)

    def derived(self, name: str, make: Callable[[], T]) -> T:
        """A value this layer's module derives once per cache from its
        weights (the absorbed matrices of multi-head latent attention,
        chapter 18): ``make()`` at the first call, the same value at every
        later one. It is kept with the cache through ``copy.deepcopy``,
        ``pickle`` and ``torch.save``, left as it is by ``reorder`` (it
        belongs to the layer, not to a sequence), and dropped by
        ``reset``. Like the cached keys and values, it was computed with
        the weights of that moment: change the weights, start a new cache.
        ``nbytes`` and ``allocated_nbytes`` count the keys and values
        only.

        Args:
            name: The value's key, one per derived value of the layer,
                e.g. ``"absorbed_up"`` in latent attention.
            make: Called with no argument, once, to compute the value.
        """
        store = self.cache._layers[self.index].derived
        if name not in store:
            store[name] = make()
        return store[name]

    def __repr__(self) -> str:
        return (f"LayerCache(layer={self.index}, length={self.length}, "
                f"kept={self.kept})")
