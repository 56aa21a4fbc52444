"""The fused path's projections on oneDNN's matrix product (chapter 13).

``F.linear`` on the CPU calls MKL's ``sgemm`` for float32. PyTorch also ships oneDNN,
whose float32 matrix product is faster on some processors: on the AMD EPYC that built
the book, about 15% on a projection's forward product and 20% on its input gradient.
``fast_linear(x, weight, bias)`` is ``F.linear`` on oneDNN, with a backward pass of its
own:

* the input's gradient ``grad @ weight`` is itself a linear layer, on oneDNN too;
* the weight's gradient ``grad.T @ x`` sums over all rows and stays on MKL (measured
  faster there);
* with ``create_graph=True`` it uses plain differentiable operations, so second
  derivatives work; forward-mode AD works too.

It takes the oneDNN route for float32 CPU products of at least ``MIN_WORK`` (2**28)
multiply-adds, rows times ``in_features`` times ``out_features``: 1024 rows at
``d_model = 512``. Everywhere else it is ``F.linear``: smaller products (one-token
decoding steps, small models: there oneDNN's set-up per call costs more than it saves),
other dtypes and devices, autocast, ``torch.compile``, ``torch.func`` transforms, or a
PyTorch without oneDNN. On the oneDNN route the numbers agree with ``F.linear`` up to
float32 rounding (the products are summed in another order), not bit for bit.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

__all__ = ["fast_linear", "onednn_available"]


def _linear_pointwise():
    """oneDNN's linear layer as PyTorch exposes it, or ``None``."""
    if platform.machine().lower() not in ("x86_64", "amd64") \
            or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None


_ONEDNN_LINEAR = _linear_pointwise()


def onednn_available() -> bool:
    """Whether ``fast_linear`` can run on oneDNN in this PyTorch build."""
    return _ONEDNN_LINEAR is not None


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
            ) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed by oneDNN: ``(..., out_features)``."""
    return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` with oneDNN forward and input gradient, MKL weight gradient."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                ) -> torch.Tensor:
        return _onednn(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.save_for_forward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # (..., out); .sum().backward() hands in an expanded one
        grad_2d = grad.view(-1, grad.size(-1))  # (N, out), N = every leading dim
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            if torch.is_grad_enabled():  # create_graph=True: differentiable operations
                grad_x = grad @ weight
            else:
                grad_x = _onednn(grad, weight.t().contiguous())  # (..., in)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_2d.t() @ x.reshape(-1, x.size(-1))  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)  # (out,)
        return grad_x, grad_weight, grad_bias

    @staticmethod
    def jvp(ctx, x_tangent, weight_tangent, bias_tangent):  # forward-mode AD
        x, weight = ctx.saved_tensors
        tangent = 0
        if x_tangent is not None:
            tangent = tangent + F.linear(x_tangent, weight)
        if weight_tangent is not None:
            tangent = tangent + F.linear(x, weight_tangent)
        if bias_tangent is not None:
            tangent = tangent + bias_tangent
        return tangent


# Multiply-adds of one product (rows x in_features x out_features) from which oneDNN is
# faster: 2**28 is 1024 rows at d_model = 512. Below it oneDNN's set-up per call costs
# more than its faster product saves (measured on the CPU that built the book).
MIN_WORK = 2**28
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass such as FakeTensor


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (
        _ONEDNN_LINEAR is not None
        and all(type(t) in _PLAIN and t.device.type == "cpu"
                and t.dtype == torch.float32 and t.layout == torch.strided for t in tensors)
        and x.numel() * weight.size(0) >= MIN_WORK  # rows x in_features x out_features
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and torch._C._functorch.maybe_current_level() is None  # no torch.func transform
    )


def fast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x @ weight.T + bias``, on oneDNN where it can.

    ``x`` is ``(..., in_features)``, ``weight`` ``(out_features, in_features)``, ``bias``
    ``(out_features,)`` or ``None``; returns ``(..., out_features)``."""
    if _use_onednn(x, weight, bias):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)
