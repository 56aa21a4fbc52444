"""Input checks shared by every layer: each failure is a ``ValueError`` or
``TypeError`` that names the argument, what was expected and what was given.

The checks read shapes, dtypes and devices, which a compiler knows while it
traces. The one check that needs the numbers inside a tensor (a float mask
of only 0s and 1s) cannot run while ``torch.compile`` or ``torch.export``
traces the code, nor under ``torch.func.vmap``: a value is not known then,
and asking for it would break the graph. There it is skipped, and a
``UserWarning`` says so (once per compilation, not once per call); eager
calls, where mistakes are made and debugged, run it.

This private module imports nothing from the package, so every layer may use
it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["check_tensor", "check_mask", "check_positive_int",
           "check_probability", "check_dropout", "check_base",
           "check_dtype", "check_device", "check_module_dtype",
           "check_flags", "shape_str", "tracing"]


def tracing() -> bool:
    """True while ``torch.compile`` or ``torch.export`` traces the code."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def shape_str(shape: Sequence[int | str]) -> str:
    """``(3, 6, 8)`` for a shape, also for shapes written with letters."""
    return "(" + ", ".join(str(s) for s in shape) + ")"


def check_tensor(
    name: str,
    x: object,
    shape: Sequence[int | str | None],
    *,
    floating: bool = True,
) -> torch.Tensor:
    """Check that ``x`` is a tensor of rank ``len(shape)`` whose sizes
    match.

    ``shape`` holds ints (that size is required) or strings/None (any
    size); strings only name the dimension in the message, e.g.
    ``("B", "L", 512)``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape "
                        f"{shape_str(shape)}, got {type(x).__name__}")
    if x.dim() != len(shape):
        letters = [s if s is not None else "*" for s in shape]
        raise ValueError(
            f"{name}: expected a {len(shape)}-D tensor of shape "
            f"{shape_str(letters)}, got a {x.dim()}-D tensor of "
            f"shape {shape_str(x.shape)}")
    for i, want in enumerate(shape):
        if isinstance(want, int) and x.shape[i] != want:
            letters = [s if s is not None else "*" for s in shape]
            raise ValueError(
                f"{name}: expected shape {shape_str(letters)} "
                f"with size {want} in dimension {i}, got shape "
                f"{shape_str(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, "
                        f"got dtype {x.dtype}")
    return x


def check_mask(mask: object, target: Sequence[int], letters: str,
               dtype: torch.dtype) -> torch.Tensor:
    """Check that ``mask`` is bool (True = may attend) or float (added to
    the scores) and broadcasts to ``target``, whose dimensions are named by
    ``letters``.

    A float mask of only 0s and 1s is refused: added to the scores it would
    mask nothing, while its author (as in Phillips' Colab notebook and in a
    typical from-scratch implementation, ``mask == 0`` = blocked) almost
    surely meant a keep/drop mask, which is ``mask.bool()``.
    """
    named = ", ".join(f"{a}={n}"
                      for a, n in zip(letters.split(), target, strict=True))
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: expected a bool or float tensor "
                        f"broadcastable to ({named}), "
                        f"got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask: expected dtype torch.bool (True = may "
                        f"attend) or a floating dtype (added to the "
                        f"scores), got {mask.dtype}")
    if mask.is_floating_point() and mask.dtype != dtype:
        raise TypeError(f"mask: expected a float mask in the scores' dtype "
                        f"{dtype}, got {mask.dtype}")
    try:
        broadcast = torch.broadcast_shapes(tuple(mask.shape), tuple(target))
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(target):
        raise ValueError(f"mask: expected a shape broadcastable to "
                         f"({named}), got {shape_str(mask.shape)}")
    if mask.is_floating_point() and mask.numel():
        _check_float_mask_values(mask)
    return mask


def _check_float_mask_values(mask: torch.Tensor) -> None:
    """Refuse a float mask of only 0s and 1s; where its values cannot be
    read (while compiling or exporting, under ``vmap``), warn instead."""
    if tracing():
        _unchecked_mask_warning("torch.compile or torch.export traces")
        return
    try:
        only_0_1 = (bool(((mask == 0) | (mask == 1)).all())
                    and bool((mask == 1).any()))
    except RuntimeError:  # torch.func.vmap: a value is not one bool
        _unchecked_mask_warning("torch.func.vmap maps")
        return
    if only_0_1:
        raise ValueError("mask: expected a bool mask (True = may attend) "
                         "or a float mask to add to the scores (0 = keep, "
                         "-inf = block), got a float mask of only 0s and "
                         "1s; for a keep (1) / drop (0) mask pass "
                         "mask.bool()")


def _unchecked_mask_warning(where: str) -> bool:
    """Warn that a float mask's values were not checked. The warning lives
    in its own module, imported here on first need: the decorator it needs
    loads PyTorch's compiler, which ``import mha_lib`` would otherwise pay
    for in every notebook and program."""
    from mha_lib._trace_warning import unchecked_mask_warning

    return unchecked_mask_warning(where)


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


def check_dropout(name: str, value: object) -> float:
    """A dropout probability of a module: a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), "
                         f"got {value!r}")
    return value


def check_base(name: str, value: object) -> float:
    """The base of rotary frequencies: a finite number > 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 1:
        raise ValueError(f"{name}: expected a finite number > 1, "
                         f"got {value!r}")
    return value


def check_flags(**flags: object) -> None:
    """Each keyword is a bool."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {flag!r}")


def check_probability(name: str, value: object) -> float:
    """A dropout probability: a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= 1:
        raise ValueError(f"{name}: expected a probability in [0, 1], "
                         f"got {value!r}")
    return value


def check_dtype(name: str, x: torch.Tensor, dtype: torch.dtype,
                whose: str) -> torch.Tensor:
    """``x.dtype == dtype``; ``whose`` says where ``dtype`` comes from, e.g.
    "the query's"."""
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} ({whose}), "
                        f"got {x.dtype}")
    return x


def check_device(name: str, x: torch.Tensor, device: torch.device,
                 whose: str) -> torch.Tensor:
    """``x.device == device``; ``whose`` says where ``device`` comes
    from."""
    if x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} "
                         f"({whose}), got one on {x.device}")
    return x


def check_module_dtype(name: str, x: torch.Tensor, module: nn.Module
                       ) -> torch.Tensor:
    """``x`` in the dtype of ``module``'s floating-point parameters (the
    first one found), which its layers would otherwise refuse with a
    message naming no argument. Skipped under autocast, which casts the
    inputs of each layer itself, and for a module with no floating-point
    parameter (all its layers quantized, say)."""
    device = x.device.type
    if tracing():  # is_autocast_available is not traceable before 2.12
        autocast = torch.is_autocast_enabled(device)
    else:
        autocast = (torch.amp.is_autocast_available(device)
                    and torch.is_autocast_enabled(device))
    if autocast:
        return x
    for p in module.parameters():
        if p.is_floating_point():
            if x.dtype != p.dtype:
                raise TypeError(
                    f"{name}: expected dtype {p.dtype} (the module's "
                    f"parameters), got {x.dtype}; convert the input "
                    f"(x.to({p.dtype})) or the module "
                    f"(module.to({x.dtype}))")
            break
    return x
