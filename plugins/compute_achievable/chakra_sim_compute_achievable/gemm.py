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

An SM margin Transformer Engine asks for leaves a GEMM fewer SMs that cuBLAS knows of (`sms`: it
picks its tile for them); communication kernels in flight hold SMs it does not know of (`busy`:
the tile it picked for the SMs it was told of runs its waves on the rest).

On Hopper (`gpu.achievable.gemm_schedule: stream_k`) cuBLAS's GEMMs do not lose whole waves: a
persistent kernel of one block per SM shares the tiles' main loops out among its blocks (stream-K),
so only tile quantization is left; the evidence is the kernel benchmark itself: mamf-finder reached
the H100's FP8 MAMF at 1024 x 9216 x 14336, where whole waves of the guide's tiles would lose 27%.
Beside communication holding SMs, its work is shared out over the SMs left (in proportion), which
is what Lee et al. (arXiv 2507.03114) measured on average: 18.9% slower compute under overlap on
A100 and H100, at most 40%; a kernel that waited for the held SMs would double. With `c_bytes` the output (C, and what an accumulating
GEMM reads of it) is written after the main loop at the achievable HBM bandwidth, not hidden behind
it: with the MAMF as the main loop's rate this reproduces DeepGEMM's published H800 FP8 table at
M = 4096 (deepseek-ai/DeepGEMM README at a6d97a1c, K from 512 to 16384: 590-1358 TFLOP/s) with a
root-mean-square error of 5% and no parameter fitted, where the main loop alone misses K = 512 by 2.3x.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from chakra_core import SimulationError

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


def quantization(m: int, n: int, batch: int, tm: int, tn: int, sm_count: int, stream_k: bool = False) -> float:
    """Useful work / work the SMs spend (tile and wave quantization together; tile quantization
    only with `stream_k`, whose persistent blocks share the tiles' main loops out evenly), in (0, 1]."""
    tiles = -(-m // tm) * -(-n // tn) * batch
    if stream_k:
        return (m * n * batch) / (tiles * tm * tn)
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
              elem_bytes: float, sm_count: int, sms: int | None = None, c_bytes: float = 0.0,
              busy: int = 0, stream_k: bool = False) -> GemmTime:
    """The time of a (batched) M x N x K GEMM, launch gap excluded, in the tile that is fastest on
    `sms` of the GPU's `sm_count` SMs (default all), run on those minus `busy` (in waves, or
    sharing its main loops out over them with `stream_k`).

    Without `c_bytes`: max(FLOPs / (MAMF x efficiency), bytes / achievable HBM bandwidth), bytes
    being A, B and C once each (the least traffic the kernel can have). With `c_bytes` (bytes per
    element of C the epilogue moves): max(main loop, A and B) + C's bytes / HBM bandwidth."""
    told = sm_count if sms is None else max(1, min(sms, sm_count))
    used = max(1, told - busy)
    flops = 2.0 * m * n * k * batch
    operands = (m * k + k * n) * batch * elem_bytes
    if c_bytes:
        memory, epilogue = operands / hbm_bps, m * n * batch * c_bytes / hbm_bps
    else:
        memory, epilogue = (operands + m * n * batch * elem_bytes) / hbm_bps, 0.0
    best: GemmTime | None = None
    for tm, tn in TILES:
        eff = quantization(m, n, batch, tm, tn, told, stream_k) * tile_efficiency(tm, tn)
        compute = flops / (mamf_flops * told / sm_count * eff)
        seconds = max(compute, memory) + epilogue
        if best is None or seconds < best.seconds:
            best = GemmTime(seconds, (tm, tn), eff, memory > compute)
    assert best is not None
    if used == told:
        return best
    tm, tn = best.tile
    eff = quantization(m, n, batch, tm, tn, used, stream_k) * tile_efficiency(tm, tn)
    compute = flops / (mamf_flops * used / sm_count * eff)
    return GemmTime(max(compute, memory) + epilogue, best.tile, eff, memory > compute)


@lru_cache(maxsize=4096)
def grouped_gemm_time(groups: tuple[tuple[int, int], ...], n: int, mamf_flops: float, hbm_bps: float,
                      elem_bytes: float, sm_count: int, sms: int | None = None, c_bytes: float = 0.0,
                      busy: int = 0, stream_k: bool = False) -> GemmTime:
    """A grouped GEMM of an [m, k] x [k, n] product per (m, k) group, each with its own operands (a
    mixture of experts' experts, their own tokens each), as Transformer Engine runs it: one cuBLAS
    GEMM per group on 4 streams at once (transformer_engine/common/gemm/cublaslt_gemm.cu
    multi_stream_cublas_gemm, NVIDIA/TransformerEngine at d0067d0d), so their tiles share the SMs.
    Tiles are quantized per group; they run in waves over every group's tiles in launch order, a
    wave lasting as long as its deepest tile (its largest k), or shared out evenly with `stream_k`.
    Groups of equal shape are `gemm_time`'s batch."""
    told = sm_count if sms is None else max(1, min(sms, sm_count))
    used = max(1, told - busy)
    flops = 2.0 * n * sum(m * k for m, k in groups)
    operands = sum(m * k + k * n for m, k in groups) * elem_bytes
    rows = sum(m for m, _ in groups)
    if c_bytes:
        memory, epilogue = operands / hbm_bps, rows * n * c_bytes / hbm_bps
    else:
        memory, epilogue = (operands + rows * n * elem_bytes) / hbm_bps, 0.0

    def timed(tm: int, tn: int, slots: int) -> GemmTime:
        depth = _tile_depth(groups, tm, -(-n // tn), slots, stream_k)   # sum of k over the tiles' slots
        eff = (flops / (2.0 * tm * tn * depth) if depth else 1.0) * tile_efficiency(tm, tn)
        compute = flops / (mamf_flops * slots / sm_count * eff) if flops else 0.0
        return GemmTime(max(compute, memory) + epilogue, (tm, tn), eff, memory > compute)

    best = min((timed(tm, tn, told) for tm, tn in TILES), key=lambda t: t.seconds)
    return best if used == told else timed(*best.tile, used)


def _tile_depth(groups: tuple[tuple[int, int], ...], tm: int, columns: int, slots: int, stream_k: bool) -> float:
    """The K the SMs run through: every tile's with `stream_k`, else `slots` times each wave's deepest."""
    tiles = [(-(-m // tm) * columns, k) for m, k in groups if m and k]
    if stream_k:
        return float(sum(count * k for count, k in tiles))
    deepest: dict[int, int] = {}
    start = 0
    for count, k in tiles:
        for wave in range(start // slots, (start + count - 1) // slots + 1):
            deepest[wave] = max(deepest.get(wave, 0), k)
        start += count
    return float(slots * sum(deepest.values()))


def gemm_groups(ms: Any, ks: Any, m: int, k: int, batch: int, node_id: int,
                name: str) -> tuple[tuple[int, int], ...] | None:
    """A grouped GEMM's (m, k) per group from `gemm_m_list` / `gemm_k_list` (absent: every group
    gemm_m / gemm_k), or None when the node has neither list."""
    if ms is None and ks is None:
        return None
    lists = [m] * batch if ms is None else ms, [k] * batch if ks is None else ks
    for what, values in zip(("gemm_m_list", "gemm_k_list"), lists):
        if not isinstance(values, list) or len(values) != batch or \
                not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise SimulationError(f"node {node_id} ({name!r}): {what} must list gemm_batch = {batch} sizes "
                                  f">= 0, one per group; found {values!r}")
    return tuple(zip(*lists))
