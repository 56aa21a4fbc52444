"""Matplotlib helpers for the notebooks (heat maps of attention weights).

Imported by notebooks only; the rest of ``mha_lib`` does not need
matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch

__all__ = ["heatmap", "heatmaps"]


def heatmap(
    weights: torch.Tensor,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax=None,
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = None,
):
    """Draw a 2-D tensor ``(Lq, Lk)``: rows are queries, columns keys.
    Returns the image."""
    weights = weights.detach().float().cpu()
    if weights.dim() != 2:
        raise ValueError(f"weights: expected a 2-D tensor (Lq, Lk), "
                         f"got shape {tuple(weights.shape)}")
    ax = ax if ax is not None else plt.gca()
    image = ax.imshow(weights.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    if x_labels is not None:
        ax.set_xticks(range(len(x_labels)), x_labels, rotation=60,
                      ha="right")
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), y_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return image


def heatmaps(
    weights: torch.Tensor,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
):
    """One heat map per head of ``(H, Lq, Lk)`` weights, side by side.
    Returns the figure."""
    weights = weights.detach()
    if weights.dim() != 3:
        raise ValueError(f"weights: expected a 3-D tensor (H, Lq, Lk), "
                         f"got shape {tuple(weights.shape)}")
    num = weights.size(0)
    fig, axes = plt.subplots(1, num, figsize=(3.2 * num, 3.4),
                             squeeze=False, layout="constrained")
    for h, ax in enumerate(axes[0]):
        image = heatmap(weights[h], x_labels,
                        y_labels if h == 0 else None,
                        titles[h] if titles else f"head {h}",
                        ax=ax, vmax=1.0)
        if h:
            ax.set_ylabel("")
            ax.set_yticks([])
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    if suptitle:
        fig.suptitle(suptitle)
    return fig
