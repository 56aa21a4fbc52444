"""The warning of a call whose float mask cannot be read (``_checks``).

Its own module because :func:`torch.compiler.assume_constant_result`
imports PyTorch's compiler (seconds); ``mha_lib._checks`` imports this
module only when a mask goes unchecked, i.e. while a compiler traces the
code, where the compiler is loaded anyway, or under ``torch.func.vmap``.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["unchecked_mask_warning"]


@torch.compiler.assume_constant_result
def unchecked_mask_warning(where: str) -> bool:
    """Run once while a compiler traces (it takes the result as a
    constant), so the warning comes once per compilation."""
    warnings.warn(
        f"mask: a float mask is added to the scores as given; while "
        f"{where} the code, its values cannot be read, so a float mask of "
        f"only 0s and 1s (a keep/drop mask, which an eager call refuses) "
        f"is not caught: pass a bool mask (True = may attend) for "
        f"keep/drop", UserWarning, stacklevel=3)
    return True
