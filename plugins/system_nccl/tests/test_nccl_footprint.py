"""What NCCL's kernels in flight take from the GPU (footprint.py, `SystemLayer.gpu_load`), and
what that does to a GEMM beside them under the `achievable` compute layer."""

from __future__ import annotations

from typing import Any

import pytest

from chakra_core import GpuLoad, pb
from chakra_core.testing import collective, comp, simulate, write_ranks
from chakra_sim_system_nccl.footprint import GpuFootprint, hbm_bytes_per_byte

NODE = "h100-sxm-hgx"


def test_a_footprint_adds_and_releases_what_each_operation_holds():
    footprint = GpuFootprint(2, hbm_cap_gbps=1000.0)
    assert footprint.load(0) == GpuLoad()
    footprint.start(0, 7, 24, 800.0, 5000)
    footprint.start(0, 8, 16, 800.0, 3000)
    assert footprint.load(0) == GpuLoad(40, 1000.0, 3000)   # traffic capped by what the links feed
    assert footprint.load(1) == GpuLoad()
    footprint.end(0, 8)
    assert footprint.load(0) == GpuLoad(24, 800.0, 5000)
    footprint.end(0, 7)
    footprint.end(0, 7)   # twice: nothing more to release
    assert footprint.load(0) == GpuLoad()
    assert hbm_bytes_per_byte(pb.ALL_REDUCE) == 3 and hbm_bytes_per_byte(pb.ALL_GATHER) == 2


def gemm_beside_all_reduce(tmp_path, comm_sms: bool) -> int:
    """8 ranks: a large all-reduce launched, then a one-wave GEMM beside it; the GEMM's end."""
    gemm = {"kernel": "gemm", "gemm_m": ("uint64_val", 11 * 256), "gemm_n": ("uint64_val", 12 * 128),
            "gemm_k": ("uint64_val", 8192), "gemm_batch": ("uint64_val", 1), "dtype": "bf16",
            "num_ops": 2 * 11 * 256 * 12 * 128 * 8192, "tensor_size": 1}
    ranks = [[collective(1, pb.ALL_REDUCE, 1 << 30), comp(2, 1, **gemm)] for _ in range(8)]
    prefix = write_ranks(tmp_path / f"t{comm_sms}", ranks)
    effects = {name: False for name in ("comm_hbm", "sustained_clock", "gemm_epilogue", "host_launch",
                                        "gpu_variation")}
    data: dict[str, Any] = {"workload": {"trace": prefix, "resources": {"comm": None}},
                            "system": {"plugin": "nccl", "profile": NODE},
                            "compute": {"plugin": "achievable", "profile": NODE,
                                        "effects": {**effects, "comm_sms": comm_sms}},
                            "output": {"dir": str(tmp_path / f"out{comm_sms}")}}
    results = simulate(data)
    return results["ranks"][0]["gpu_compute_ns"]


def test_a_gemm_beside_an_all_reduce_loses_the_sms_nccl_runs_on(tmp_path):
    alone, beside = gemm_beside_all_reduce(tmp_path, False), gemm_beside_all_reduce(tmp_path, True)
    # NCCL runs the 1 GiB all-reduce as NVLS on 16 channels: H100's stream-K GEMM shares its main
    # loops out over the 116 SMs left
    assert beside == pytest.approx(alone * 132 / 116, rel=0.01)


GEMM = {"kernel": "gemm", "gemm_m": ("uint64_val", 11 * 256), "gemm_n": ("uint64_val", 12 * 128),
        "gemm_k": ("uint64_val", 8192), "gemm_batch": ("uint64_val", 1), "dtype": "bf16",
        "num_ops": 2 * 11 * 256 * 12 * 128 * 8192, "tensor_size": 1}
ONLY_SMS = {"comm_sms": True, **{name: False for name in ("comm_hbm", "sustained_clock", "gemm_epilogue",
                                                           "host_launch", "gpu_variation")}}


def gemm_and_collective(tmp_path, name: str, ranks: list[list[Any]]) -> dict[str, Any]:
    prefix = write_ranks(tmp_path / name, ranks)
    return simulate({"workload": {"trace": prefix, "resources": {"comm": None}},
                     "system": {"plugin": "nccl", "profile": NODE},
                     "compute": {"plugin": "achievable", "profile": NODE, "effects": ONLY_SMS},
                     "output": {"dir": str(tmp_path / f"out-{name}")}})


def test_a_gemm_is_timed_alike_whichever_of_it_and_a_collective_issues_first_at_an_instant(tmp_path):
    """The GEMM's thread blocks share the GPU with NCCL's from the instant both run: a kernel
    issued before the collective in the same ns is re-timed when it starts (compute_achievable
    sharing.py), not run alone."""
    first = gemm_and_collective(tmp_path, "gemm-first", [[comp(1, 1, **GEMM), collective(2, pb.ALL_REDUCE, 1 << 30)]
                                                         for _ in range(8)])
    second = gemm_and_collective(tmp_path, "coll-first", [[collective(1, pb.ALL_REDUCE, 1 << 30), comp(2, 1, **GEMM)]
                                                          for _ in range(8)])
    assert first["ranks"][0]["gpu_compute_ns"] == second["ranks"][0]["gpu_compute_ns"]
    alone = gemm_beside_all_reduce(tmp_path, False)
    assert first["ranks"][0]["gpu_compute_ns"] == pytest.approx(alone * 132 / 116, rel=0.01)


def test_a_collective_starting_midway_slows_the_rest_of_a_running_gemm(tmp_path):
    """Issued a host op's 40 µs into the GEMM, the all-reduce leaves the GEMM's remaining work
    the SMs NCCL does not hold: 40 µs alone, the rest at 116/132 of the rate, until the
    all-reduce ends (it outlasts the GEMM here)."""
    delayed = [[comp(1, 1, **GEMM), comp(2, 40, is_cpu_op=True), collective(3, pb.ALL_REDUCE, 1 << 30, deps=[2])]
               for _ in range(8)]
    results = gemm_and_collective(tmp_path, "midway", delayed)
    alone = gemm_beside_all_reduce(tmp_path, False)
    loaded = gemm_beside_all_reduce(tmp_path, True)
    assert 40_000 < alone
    expected = 40_000 + (1 - 40_000 / alone) * loaded
    assert results["ranks"][0]["gpu_compute_ns"] == pytest.approx(expected, abs=2)
    assert alone < results["ranks"][0]["gpu_compute_ns"] < loaded
