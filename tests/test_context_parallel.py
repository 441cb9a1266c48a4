"""Context-parallel attention (job.parallel.cp_comm_type): ring attention's exchanges in closed form,
its steps' FLOPs equal to one causal kernel's, every send met by its receive, a folded run equal to
an unfolded one, the all-to-all variant's sizes and its head rule."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.et.attrs import NodeView
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.schema import pb
from tests.simhelpers import job_folded_and_unfolded

MODEL = {"layers": 4, "hidden": 512, "ffn_hidden": 1408, "heads": 8, "kv_heads": 4, "vocab": 8000}


def job(cp: int, comm: str, tp: int = 1, pp: int = 1, dp: int = 1, seq: int = 1024, microbatches: int = 2,
        **training: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "cp", "model": MODEL, "parallel": {"tp": tp, "pp": pp, "cp": cp, "cp_comm_type": comm},
        "training": {"seq": seq, "global_batch": microbatches * dp, "micro_batch": 1, **training},
        "cluster": {"gpus": tp * pp * cp * dp, "profile": "h100-hgx-ndr400"}})


def nodes_of(spec: JobSpec, rank: int) -> list[pb.Node]:
    return RankProgram(spec, Placement(spec, 8), rank).build()


def kv_bytes(spec: JobSpec) -> int:
    """One rank's key/value block: k and v of its seq/cp tokens for its kv heads, in bf16."""
    m, p = spec.shape, spec.parallel
    return 2 * (spec.training.seq // p.cp) * (m.groups // p.tp) * m.head_dim * 2


@settings(max_examples=12, deadline=None)
@given(cp=st.sampled_from([2, 4]), tp=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "full"]))
def test_ring_attention_sends_the_closed_form_bytes(cp, tp, recompute):
    """Per layer and micro-batch: the forward passes the block cp - 1 times; the backward passes it
    with its gradient, 2 (cp - 1) blocks in all (the block alone first, the gradient alone last); a
    recomputed forward passes it again."""
    spec = job(cp, "p2p", tp=tp, recompute=recompute)
    sent = sum(NodeView(n).int("comm_size") for n in nodes_of(spec, 0)
               if n.type == pb.COMM_SEND_NODE and NodeView(n).str("step_part") == "cp")
    forwards = 2 if recompute == "full" else 1
    per_layer = (forwards * (cp - 1) + 2 * (cp - 1)) * kv_bytes(spec)
    assert sent == spec.microbatches * MODEL["layers"] * per_layer


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_steps_do_the_work_of_one_causal_kernel(cp):
    """The diagonal causal block and cp - 1 half blocks: the FLOPs of one causal kernel over the
    rank's queries against the whole sequence (allgather's single kernel)."""
    def attention_flops(comm: str) -> Counter[str]:
        flops: Counter[str] = Counter()
        for node in nodes_of(job(cp, comm), 0):
            view = NodeView(node)
            if node.type == pb.COMP_NODE and view.str("kernel") == "attention":
                flops[view.str("attn_pass")] += view.int("num_ops")
        return flops
    assert attention_flops("p2p") == attention_flops("allgather")
    if cp <= 4:   # a2a splits the 4 key/value heads over cp
        assert attention_flops("a2a") == attention_flops("p2p")


def test_every_ring_send_meets_a_receive_of_the_same_size():
    spec = job(4, "p2p", tp=2, pp=2)
    sends: Counter[tuple[int, int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int, int]] = Counter()
    for rank in range(spec.cluster.gpus):
        for node in nodes_of(spec, rank):
            if node.type not in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                continue
            view = NodeView(node)
            key = (view.int("comm_src"), view.int("comm_dst"), view.int("comm_tag"), view.int("comm_size"))
            if node.type == pb.COMM_SEND_NODE:
                sends[key] += 1
            else:
                recvs[key] += 1
    assert sends == recvs and sends


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather"])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, comm):
    spec = job(2 if comm == "a2a" else 4, comm, tp=2, pp=2, dp=2).model_dump(mode="json")   # a2a: 2 kv heads
    finish = job_folded_and_unfolded(spec, tmp_path)
    assert finish["auto"] == finish["off"]


def test_a2a_moves_q_k_v_and_the_output_through_all_to_alls():
    spec = job(2, "a2a")
    sizes = [NodeView(n).int("comm_size") for n in nodes_of(spec, 0)
             if n.type == pb.COMM_COLL_NODE and NodeView(n).int("comm_type") == pb.ALL_TO_ALL]
    q = (spec.training.seq // 2) * MODEL["heads"] * spec.shape.head_dim * 2
    per_layer = [q + kv_bytes(spec), q, q, q + kv_bytes(spec)]   # forward in and out, backward in and out
    assert sorted(sizes) == sorted(per_layer * MODEL["layers"] * spec.microbatches)


def test_a2a_needs_heads_divisible_by_cp():
    with pytest.raises(ValueError, match="cp_comm_type a2a splits each rank's heads over cp: its 4 query heads "
                                         "and 2 key/value heads"):
        job(4, "a2a", tp=2)
