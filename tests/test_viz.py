"""``mha_lib.viz.heatmaps`` hatches exactly the cells a mask hides."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from mha_lib import causal_mask  # noqa: E402
from mha_lib.viz import heatmaps  # noqa: E402


def _hatched(ax) -> set[tuple[int, int]]:
    """The (query, key) cells of ``ax`` covered by a hatched patch."""
    return {(round(p.get_y() + 0.5), round(p.get_x() + 0.5))
            for p in ax.patches
            if isinstance(p, Rectangle) and p.get_hatch()}


def test_heatmaps_hatch_the_hidden_cells_of_every_head():
    weights = torch.rand(4, 5, 5).softmax(-1)  # (H, Lq, Lk)
    mask = causal_mask(5)
    fig = heatmaps(weights, mask=mask)
    hidden = {tuple(ij) for ij in (~mask).nonzero().tolist()}
    maps = fig.axes[:4]  # the last axes is the colour bar
    assert all(_hatched(ax) == hidden for ax in maps)
    assert len(hidden) == 10
    plt.close(fig)


def test_heatmaps_without_a_mask_hatch_nothing():
    fig = heatmaps(torch.rand(2, 3, 4).softmax(-1))
    assert not any(_hatched(ax) for ax in fig.axes)
    plt.close(fig)


@pytest.mark.parametrize("mask, error, message", [
    (causal_mask(5).float(), TypeError, r"mask: expected a bool tensor .* got torch\.float32"),
    (causal_mask(4), ValueError, r"mask: expected shape \(Lq, Lk\) = \(5, 5\), got \(4, 4\)")])
def test_heatmaps_refuse_a_mask_of_another_dtype_or_shape(mask, error, message):
    with pytest.raises(error, match=message):
        heatmaps(torch.rand(2, 5, 5).softmax(-1), mask=mask)
