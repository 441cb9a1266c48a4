"""Synthetic nccl-tests logs for the parser and calibration tests."""

from __future__ import annotations

from chakra_sim_system_nccl.nccl_tests import busbw_factor


def time_text(time_us: float) -> str:
    return f"{time_us:7.0f}" if time_us >= 10_000 else f"{time_us:7.1f}" if time_us >= 100 else f"{time_us:7.2f}"


def result_line(size: int, count: int, dtype: str, redop: str, root: int, factor: float,
                times_us: list[float | None]) -> str:
    """One row as nccl-tests prints it (common.cu Reporter formats); None: that half is N/A."""
    line = f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:6d}"
    for time_us in times_us:
        if time_us is None:
            line += "      N/A     N/A     N/A    N/A"
            continue
        algbw = size / (time_us * 1e3)
        line += f"  {time_text(time_us):>7s}  {algbw:6.2f}  {algbw * factor:6.2f}  {0:5d}"
    return line


def synthetic_log(ranks: int, collective: str, sizes=(1024, 1 << 20, 1 << 28), with_devices: bool = True,
                  extra_rows: tuple[str, ...] = ()) -> str:
    word = 4
    per_rank = ranks if collective in ("all_gather", "reduce_scatter", "alltoall") else 1
    redop = "sum" if collective in ("all_reduce", "reduce_scatter") else "none"
    factor = busbw_factor(collective, ranks)
    lines = ["# nccl-tests version 2.17.9 nccl-headers=22403 nccl-library=22403",
             f"# Collective test starting: {collective}_perf",
             "# nThread 1 nGpus 1 minBytes 1024 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20",
             "#", "# Using devices"]
    if with_devices:
        lines += [f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on   testhost device {rank:2d} "
                  f"[0000:{rank:02x}:00] NVIDIA Test GPU" for rank in range(ranks)]
    lines += ["NCCL version 2.24.3+cuda12.6",
              "#                                                              out-of-place                       in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
              result_line(0, 0, "float", redop, -1, factor, [0.25, 0.23])]
    for size in sizes:
        latency, bandwidth = 20.0, 150.0   # us, GB/s
        time_us = latency + size / (bandwidth * 1e3)
        lines.append(result_line(size, size // word // per_rank, "float", redop, -1, factor,
                                 [time_us, time_us * 1.01]))
    lines += list(extra_rows)
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.345", "#",
              f"# Collective test concluded: {collective}_perf"]
    return "\n".join(lines) + "\n"
