"""`training.attention_kernel`: a job names the library of its fused attention kernels; the attention
nodes carry it (`attn_kernel`) and the compute layer times them with the profile's curves of it.
`auto` writes the traces as before; an unfused job cannot name one; a library the profile does not
measure stops the run with the profile and the libraries it has."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from chakra_core import run
from chakra_core.errors import SimulationError
from chakra_core.jobs.fsdp import rank_program
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb

MODEL = {"layers": 2, "hidden": 1024, "ffn_hidden": 2816, "heads": 8, "kv_heads": 8, "vocab": 8000}


def job(profile: str = "h100-hgx-ndr400", **training: Any) -> dict[str, Any]:
    return {"name": "attn", "model": dict(MODEL), "parallel": {"tp": 2},
            "training": {"seq": 8192, "global_batch": 4, **training}, "cluster": {"gpus": 8, "profile": profile}}


def nodes(data: dict[str, Any]) -> list[pb.Node]:
    spec = JobSpec.model_validate(data)
    return rank_program(spec, Placement(spec, 8), 0).build()


def kernels_named(data: dict[str, Any]) -> set[str]:
    return {a.string_val for n in nodes(data) for a in n.attr if a.name == "attn_kernel"}


def step_s(tmp_path: Path, data: dict[str, Any]) -> float:
    manifest = {"job": copy.deepcopy(data), "output": {"dir": str(tmp_path / "out")},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    return float(run.simulate(run.load(manifest, base_dir=tmp_path)).document["training"]["step_time_s"])


def test_auto_writes_the_traces_as_before_and_a_library_marks_every_attention_node():
    before = [n.SerializeToString() for n in nodes(job())]
    assert [n.SerializeToString() for n in nodes(job(attention_kernel="auto"))] == before
    assert kernels_named(job()) == set()
    flash2 = nodes(job(attention_kernel="flash2"))
    attention = [n for n in flash2 if any(a.name == "attn_pass" for a in n.attr)]
    assert attention and all(any(a.name == "attn_kernel" and a.string_val == "flash2" for a in n.attr)
                             for n in attention)


def test_the_echo_shows_the_setting_only_when_set():
    assert "attention_kernel" not in JobSpec.model_validate(job()).training.model_dump()
    assert JobSpec.model_validate(job(attention_kernel="cudnn")).training.model_dump()["attention_kernel"] == "cudnn"


def test_an_unfused_job_cannot_name_a_library():
    with pytest.raises(ValidationError, match="attention_kernel flash2 needs attention: flash"):
        JobSpec.model_validate(job(attention="unfused", attention_kernel="flash2"))


def test_flashattention2_makes_the_step_slower_on_h100(tmp_path: Path):
    steps = {kernel: step_s(tmp_path / kernel, job(attention_kernel=kernel)) for kernel in ("auto", "flash3", "flash2")}
    assert steps["auto"] == steps["flash3"] < steps["flash2"]


def test_a_library_the_profile_does_not_measure_names_the_profile(tmp_path: Path):
    with pytest.raises(SimulationError, match="profile 'b200-sxm-hgx' measures no flash2 attention"):
        step_s(tmp_path, job("b200-sxm-hgx", attention_kernel="flash2"))
