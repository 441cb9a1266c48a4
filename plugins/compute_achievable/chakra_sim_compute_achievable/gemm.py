"""GEMM time with tile and wave quantization, after NVIDIA's "Matrix Multiplication Background
User's Guide" (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/).

The output (M x N, per batch) is cut into CTA tiles; every SM works on one tile at a time, so
- tile quantization: M and N are rounded up to whole tiles (a 257-row GEMM costs as much as 384
  rows with 128-row tiles);
- wave quantization: the tiles run in waves of `sm_count`; the last, partial wave costs a whole one.

A tile of (tm, tn) computes 2 tm tn K FLOPs at the per-SM share of the maximum achievable matmul
rate (MAMF / sm_count), scaled by the tile's operand reuse (below). The guide lists the tiles
cuBLAS picks from (256x128 and 128x256 most efficient, then 128x128, 256x64/64x256, 128x64/64x128,
64x64 least) and says its heuristics aim for the fastest; we take the tile with the shortest time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256),
                                      (128, 64), (64, 128), (64, 64))
"""CTA tile shapes (rows of M, columns of N), most efficient first (NVIDIA's guide, 'Tile Quantization')."""

_FULL_REUSE = 128 * 128 / (128 + 128)
"""Operand reuse of a 128x128 tile: FLOPs per loaded element scale with tm tn / (tm + tn). The guide
gives no rate per tile; we assume tiles at least this large feed the tensor cores fully (the MAMF
is reached with them) and smaller ones in proportion to their reuse (a model assumption)."""


def tile_efficiency(tm: int, tn: int) -> float:
    """Fraction of the per-SM MAMF a tile shape sustains (1 for 128x128 and larger)."""
    return min(1.0, tm * tn / (tm + tn) / _FULL_REUSE)


def quantization(m: int, n: int, batch: int, tm: int, tn: int, sm_count: int) -> float:
    """Useful work / work the SMs spend (tile and wave quantization together), in (0, 1]."""
    tiles = -(-m // tm) * -(-n // tn) * batch
    waves = -(-tiles // sm_count)
    return (m * n * batch) / (waves * sm_count * tm * tn)


@dataclass(frozen=True)
class GemmTime:
    seconds: float
    tile: tuple[int, int]
    efficiency: float          # of the MAMF: quantization x tile efficiency, <= 1
    memory_bound: bool


@lru_cache(maxsize=65536)   # a training step repeats the same few shapes thousands of times
def gemm_time(m: int, n: int, k: int, batch: int, mamf_flops: float, hbm_bps: float,
              elem_bytes: float, sm_count: int) -> GemmTime:
    """The fastest tile's time for a (batched) M x N x K GEMM, launch gap excluded.

    Time = max(FLOPs / (MAMF x efficiency), bytes / achievable HBM bandwidth), bytes being A, B
    and C once each (the least traffic the kernel can have)."""
    flops = 2.0 * m * n * k * batch
    memory = (m * k + k * n + m * n) * batch * elem_bytes / hbm_bps
    best: GemmTime | None = None
    for tm, tn in TILES:
        eff = quantization(m, n, batch, tm, tn, sm_count) * tile_efficiency(tm, tn)
        compute = flops / (mamf_flops * eff)
        seconds = max(compute, memory)
        if best is None or seconds < best.seconds:
            best = GemmTime(seconds, (tm, tn), eff, memory > compute)
    assert best is not None
    return best
