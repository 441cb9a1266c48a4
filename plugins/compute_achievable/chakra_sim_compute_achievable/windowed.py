"""Sliding-window attention (`attn_window`): the key tiles a window's band touches.

A windowed kernel (query i attends to keys i - w + 1 ... i) runs, for each tile of query rows,
the key tiles the band of its rows touches and no others, masking the band's edges inside them:
FlashAttention-2's local attention (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_kernel.h,
n_block_min from window_size_left, n_block_max from the causal diagonal; the backward walks the
same band from the key side), as FlashAttention-3 and cuDNN's sliding-window kernels do. With
tiles of B rows and keys that is ceil((w - 1) / B) + 1 key tiles per query tile once the band is
full (fewer in the first rows). Those tiles are timed at the rate of a non-causal kernel whose
query tiles iterate as many key tiles (the pass's non-causal curve at that many keys), and the
masked part of them counts as work: the rate of the useful FLOPs (`num_ops`) is that rate times
the band's share of the tiles computed.
"""

from __future__ import annotations


def band(seq_q: int, seq_kv: int, window: int, tile: int) -> tuple[int, float]:
    """(keys a query tile iterates once the band is full, the useful share of the tiles computed)
    for a causal window of `window` keys over tiles of `tile` rows and keys. Queries of a sequence
    as long as the keys start at key 0 (the first rows see fewer keys); a shorter query block
    (context-parallel shares) is counted with full bands."""
    per_tile = -(-(window - 1) // tile) + 1
    rows = -(-seq_q // tile)
    if seq_q == seq_kv:   # tile row j touches min(j + 1, per_tile) key tiles
        full = max(0, rows - per_tile)
        short = rows - full
        computed = short * (short + 1) // 2 + full * per_tile
        w = min(window, seq_q)
        useful = w * (w + 1) // 2 + (seq_q - w) * w
    else:
        computed, useful = rows * per_tile, seq_q * min(window, seq_kv)
    return per_tile * tile, useful / (computed * tile * tile)
