"""Chapter 13's checkers accept a right answer and refuse the usual wrong ones, including a
plain softmax over the whole row (not tiled) and tiles whose all-masked rows turn NaN."""

import torch

from mha_lib.exercises import check_masked_tiles, check_tiled_softmax

NEG_INF = float("-inf")


def tiled_softmax(scores, block_size):
    m = scores.new_full((*scores.shape[:-1], 1), NEG_INF)
    total = torch.zeros_like(m)
    for block in scores.split(block_size, dim=-1):
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        total = total * torch.exp(m - m_new) \
            + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.cat([torch.exp(block - m) / total
                      for block in scores.split(block_size, dim=-1)], dim=-1)


def masked_tiles(q, k, v, mask, block_size, safe=True):
    scale = q.size(-1) ** -0.5
    outs = []
    for start, q_block in zip(range(0, q.size(-2), block_size),
                              q.split(block_size, dim=-2), strict=True):
        m = q_block.new_full((*q_block.shape[:-1], 1), NEG_INF)
        total = torch.zeros_like(m)
        o = q_block.new_zeros((*q_block.shape[:-1], v.size(-1)))
        for key_start, k_block, v_block in zip(
                range(0, k.size(-2), block_size), k.split(block_size, dim=-2),
                v.split(block_size, dim=-2), strict=True):
            tile = mask[start:start + block_size, key_start:key_start + block_size]
            s = (q_block @ k_block.transpose(-2, -1) * scale).masked_fill(~tile, NEG_INF)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            base = m_new.masked_fill(m_new == NEG_INF, 0.0) if safe else m_new
            p, correction = torch.exp(s - base), torch.exp(m - base)
            total = correction * total + p.sum(dim=-1, keepdim=True)
            o = correction * o + p @ v_block
            m = m_new
        outs.append(torch.where(total > 0, o / total.clamp_min(1e-30), 0.0))
    return torch.cat(outs, dim=-2)


def test_tiled_softmax_checker():
    assert check_tiled_softmax(tiled_softmax)
    plain = check_tiled_softmax(lambda s, b: torch.softmax(s, dim=-1))
    assert not plain and "softmax on 7 scores at once" in plain.message
    two_pass = check_tiled_softmax(
        lambda s, b: torch.exp(s - s.amax(-1, keepdim=True))
        / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True))
    assert not two_pass and "at once" in two_pass.message
    per_block = check_tiled_softmax(lambda s, b: torch.cat(
        [torch.softmax(x, dim=-1) for x in s.split(b, dim=-1)], dim=-1))
    assert not per_block and "normalised on its own" in per_block.message


def test_masked_tiles_checker():
    assert check_masked_tiles(masked_tiles)
    unsafe = check_masked_tiles(lambda *args: masked_tiles(*args, safe=False))
    assert not unsafe and "keys 0-4 padded" in unsafe.message
    nan = check_masked_tiles(
        lambda q, k, v, mask, b: masked_tiles(q, k, v, mask, b, safe=False) / 0 * 0)
    assert not nan and "NaN" in nan.message
    whole = check_masked_tiles(lambda q, k, v, mask, b: torch.softmax(
        (q @ k.mT).masked_fill(~mask, NEG_INF), dim=-1) @ v)
    assert not whole and "at once" in whole.message
