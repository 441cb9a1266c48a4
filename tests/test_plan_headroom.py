"""`chakra-sim plan`'s memory limit: the GPU's usable memory less a reserve for the CUDA context,
NCCL's buffers and fragmentation (chakra_core.plan.headroom); --headroom replaces the reserve."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import load_profile
from chakra_core.plan.headroom import (CUDA_CONTEXT_BYTES, FRAGMENTATION, GIB, Headroom, Reserve, communicator_bytes,
                                       communicators)
from chakra_core.plan.layouts import Layout
from chakra_core.plan.search import SIMULATED, TOO_BIG, PlanOptions, plan
from chakra_core.sweep.run import Execution
from chakra_core.plugins import make_plugin_host
from chakra_sim_system_nccl.section import NCCL_RING_BYTES

PROFILE = "h100-hgx-ndr400"
# Llama 2 7B on one H100 node: TP2 PP4 with micro-batch 8 predicts 78.9 GiB per GPU, which fits in
# 80 GiB and in the 79.2 GiB a program can use, but not with its reserve
JOB = {"name": "t", "model": "llama2-7b", "training": {"seq": 4096, "global_batch": 32},
       "cluster": {"gpus": 8, "profile": PROFILE}}
SEARCH = {"micro_batches": (8,), "recompute": ("none",), "distributed_optimizer": (True,), "max_cp": 1}
TIGHT = Layout(tp=2, pp=4, vp=1, cp=1, dp=1, micro_batch=8, recompute="none", distributed_optimizer=True)


def manifest(**job: Any) -> dict[str, Any]:
    return {"job": {**JOB, **job}, "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}


def test_the_reserve_is_the_context_nccl_buffers_and_fragmentation():
    # the nccl system layer says what one communicator holds (SystemLayer.communicator_memory_bytes)
    headroom = Headroom.of(load_profile(PROFILE), None,
                           communicator_bytes(manifest(), Path("."), make_plugin_host(), PROFILE, 8))
    assert headroom.usable == int(79.2 * GIB) and headroom.usable_from == "gpu.usable_memory_gib"
    # NCCL: per channel two connections of LL (512 KiB), LL128 (4,800 KiB) and Simple (4 MiB) buffers
    assert NCCL_RING_BYTES == 2 * (512 + 4800 + 4096) * 1024
    assert headroom.nccl_per_communicator == 24 * NCCL_RING_BYTES          # the profile's nccl.channels
    assert communicators(TIGHT) == 2 and communicators(Layout(1, 1, 1, 2, 4, 1, "none", True)) == 2
    assert communicators(Layout(1, 1, 1, 1, 1, 1, "none", True)) == 0
    assert communicators(Layout(2, 2, 1, 2, 2, 1, "none", True)) == 4     # TP, CP, DP x CP, PP
    reserve = headroom.reserve(TIGHT, 78 * GIB)
    assert reserve == Reserve(CUDA_CONTEXT_BYTES, 2 * 24 * NCCL_RING_BYTES, math.ceil(FRAGMENTATION * 78 * GIB))
    assert 1.9 * GIB < reserve.total < 2.1 * GIB
    assert Headroom.of(load_profile(PROFILE), 3.5).reserve(TIGHT, 78 * GIB) == Reserve(given=int(3.5 * GIB))
    assert Reserve(given=0).total == 0


def test_a_layout_that_fits_in_80_gib_but_not_with_its_reserve_is_not_recommended(tmp_path):
    found = plan(manifest(), tmp_path, tmp_path / "out",
                 PlanOptions(top=1, batch=1, search=SEARCH), Execution(workers=1))
    tight = next(c for c in found.candidates if c.layout == TIGHT)
    assert tight.memory.total <= found.usable_bytes < 80 * GIB        # the memory alone fits
    assert tight.status == TOO_BIG
    over = (tight.memory.total + tight.reserve.total - found.usable_bytes) / GIB
    assert tight.overflow.startswith(f"needs {tight.memory.total / GIB:.1f} GiB + {tight.reserve.total / GIB:.1f} "
                                     f"GiB reserve of 79.2 GiB ({over:.1f} GiB over)")
    assert all(c.memory.total + c.reserve.total <= found.usable_bytes for c in found.candidates if c.status != TOO_BIG)
    # --headroom 0: the old limit, up to the usable memory (not the datasheet's 80 GiB)
    bare = plan(manifest(), tmp_path, tmp_path / "bare",
                PlanOptions(top=1, batch=1, search=SEARCH, headroom_gib=0, include=(TIGHT,)), Execution(workers=1))
    assert next(c for c in bare.candidates if c.layout == TIGHT).status == SIMULATED
    assert all((c.status == TOO_BIG) == (c.memory.total > bare.usable_bytes) for c in bare.candidates)


def test_the_outputs_say_the_usable_memory_and_the_reserve(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    out = tmp_path / "p"
    args = ["plan", str(job), "--top", "1", "--batch", "1", "--micro-batches", "8", "--out", str(out), "-j", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "79.20 GiB usable per GPU" in text and "reserve GiB" in text
    assert "reserve: CUDA context 0.37 GiB + NCCL 0.43 GiB per communicator" in text
    rows = list(csv.DictReader((out / "plan.csv").open()))
    assert all(float(r["memory_usable_gib"]) == pytest.approx(79.2) for r in rows)
    assert all(float(r["memory_reserve_gib"]) > 0.37 for r in rows)
    data = json.loads((out / "plan.json").read_text())
    assert data["usable_memory_gib"] == pytest.approx(79.2) and data["gpu_memory_gib"] == 80
    assert data["reserve"]["nccl_per_communicator_gib"] == pytest.approx(24 * NCCL_RING_BYTES / GIB)
    import pyarrow.parquet as pq

    assert "memory_reserve_gib" in pq.read_table(out / "plan.parquet").column_names
    # a given reserve, for every layout
    result = CliRunner().invoke(main, [*args, "--headroom", "5", "--out", str(tmp_path / "h")])
    assert result.exit_code == 0, result.output
    assert "a reserve of 5.00 GiB (--headroom)" in " ".join(result.output.split())
    assert json.loads((tmp_path / "h" / "plan.json").read_text())["reserve"] == {"given_gib": 5.0}
    assert {float(r["memory_reserve_gib"]) for r in csv.DictReader((tmp_path / "h" / "plan.csv").open())} == {5.0}


@pytest.mark.parametrize("headroom", ["80", "nan", "-1"])
def test_a_headroom_beyond_the_gpu_is_a_clear_error(tmp_path, headroom):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest()))
    result = CliRunner().invoke(main, ["plan", str(job), "--headroom", headroom, "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and "--headroom" in result.output, result.output
    with pytest.raises(ManifestError, match=r"--headroom: 79\.5 GiB: give a reserve of at least 0 and below the "
                                            r"79\.20 GiB a GPU can use"):
        Headroom.of(load_profile(PROFILE), 79.5)


def test_without_usable_memory_the_plan_counts_the_datasheets_and_says_so(tmp_path):
    base = load_profile("h100-sxm-hgx").as_data()
    del base["gpu"]["usable_memory_gib"]
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(base))
    headroom = Headroom.of(load_profile(tmp_path / "flat.yaml"))
    assert headroom.usable == 80 * GIB
    assert headroom.usable_from.startswith("gpu.memory_gib (profile 'h100-sxm-hgx' gives no")
    assert headroom.warnings and "gives no gpu.usable_memory_gib" in headroom.warnings[0]
    # inherited although the memory changed: the datasheet's memory, and the inherited rate named
    (tmp_path / "more.yaml").write_text('extends: h100-hgx-ndr400\ngpu:\n  memory_gib: {value: 96, source: "x"}\n')
    headroom = Headroom.of(load_profile(tmp_path / "more.yaml"))
    assert headroom.usable == 96 * GIB
    assert "gpu.usable_memory_gib = 79.2 inherited from h100-hgx-ndr400" in headroom.warnings[0]
    assert "gpu.memory_gib changed 80 -> 96" in headroom.warnings[0]


def test_a_plan_on_a_profile_with_inherited_rates_says_so(tmp_path):
    # more and faster memory, the H100's peaks: the inherited rates are named, the plan runs
    (tmp_path / "more.yaml").write_text('extends: h100-hgx-ndr400\ngpu:\n  memory_gib: {value: 96, source: "x"}\n'
                                        '  memory_bandwidth_gbps: {value: 4000, source: "x"}\n')
    small = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
    options = PlanOptions(top=1, batch=1, search={**SEARCH, "micro_batches": (1,)})
    found = plan(manifest(model=small, cluster={"gpus": 8, "profile": "more.yaml"}), tmp_path, tmp_path / "out",
                 options, Execution(workers=1))
    assert found.usable_bytes == 96 * GIB
    assert any("gpu.usable_memory_gib = 79.2 inherited" in w for w in found.warnings)
    assert any("achievable: profile 'more': gpu.achievable.hbm_gbps = 2466 inherited" in w for w in found.warnings)
    # a raised peak with the parent's matmul rate is refused (issue 35: another GPU's measurement)
    (tmp_path / "peak.yaml").write_text('extends: h100-hgx-ndr400\ngpu:\n  peak_tflops:\n'
                                        '    bf16: {value: 1200, source: "x"}\n')
    # (the bf16 MAMF and the bf16 curves of FlashAttention-3, -2 and cuDNN)
    with pytest.raises(ManifestError, match=r"profile 'peak' keeps 10 achievable rate\(s\) measured on another GPU"):
        plan(manifest(model=small, cluster={"gpus": 8, "profile": "peak.yaml"}), tmp_path, tmp_path / "out2",
             options, Execution(workers=1))
