"""Context-parallel attention (job.parallel.cp_comm_type): ring attention's exchanges in closed form,
its steps' FLOPs equal to one causal kernel's, every send met by its receive, a folded run equal to
an unfolded one, the all-to-all variant's sizes and its head rule, the hierarchical a2a+p2p variant's
groups, exchanges and rules."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
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
        sizes: list[int] | None = None, **training: Any) -> JobSpec:
    hierarchical = {} if sizes is None else {"hierarchical_context_parallel_sizes": sizes}
    return JobSpec.model_validate({
        "name": "cp", "model": MODEL, "parallel": {"tp": tp, "pp": pp, "cp": cp, "cp_comm_type": comm, **hierarchical},
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


@pytest.mark.parametrize("comm", ["p2p", "a2a", "allgather", "a2a+p2p"])
def test_a_folded_run_equals_every_rank_simulated(tmp_path, comm):
    sizes = [2, 2] if comm == "a2a+p2p" else None   # a2a and a2a+p2p: 2 kv heads to split
    spec = job(2 if comm == "a2a" else 4, comm, tp=2, pp=2, dp=2, sizes=sizes).model_dump(mode="json")
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


# a2a+p2p ------------------------------------------------------------------------------------------
def hierarchical_groups(ranks: list[int], sizes: list[int]) -> list[list[list[int]]]:
    """Megatron-Core's create_hierarchical_groups (parallel_state.py at d98e8a64): level i's groups
    are einops' "(l s u) -> (l u) s" of the CP group's ranks, u the product of the sizes below i."""
    out = []
    for level, size in enumerate(sizes):
        u, rest = int(np.prod(sizes[:level])), int(np.prod(sizes[level + 1:]))
        out.append(np.array(ranks).reshape(rest, size, u).transpose(0, 2, 1).reshape(rest * u, size).tolist())
    return out


@pytest.mark.parametrize("sizes, tp", [([2, 4], 2), ([4, 2], 1), ([2, 2], 2)])
def test_a2a_p2p_groups_are_megatrons_hierarchical_groups(sizes, tp):
    cp = sizes[0] * sizes[1]
    spec = job(cp, "a2a+p2p", tp=tp, dp=2, sizes=sizes, seq=2048)
    placement = Placement(spec, 8)
    for rank in range(spec.cluster.gpus):
        groups = placement.groups(rank)
        a2a_groups, p2p_groups = hierarchical_groups(list(groups["cp"]), sizes)
        assert list(groups["cp_a2a"]) in a2a_groups and rank in groups["cp_a2a"]
        assert list(groups["cp_p2p"]) in p2p_groups and rank in groups["cp_p2p"]


def test_a2a_p2p_rings_to_te_s_send_destination_and_keeps_the_flops():
    """The ring's sends go where TE's AttnFuncWithCPAndKVP2P sends (forward: cp_global_ranks[(rank + 1)
    % cp_size * cp_size_a2a + rank_a2a]), every send meets a receive, the all-to-alls run over the a2a
    group, and the attention does p2p's FLOPs over the same sequence."""
    spec = job(8, "a2a+p2p", tp=1, sizes=[2, 4], seq=2048)
    placement = Placement(spec, 8)
    sends: Counter[tuple[int, int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int, int]] = Counter()
    for rank in range(8):
        groups = placement.groups(rank)
        cp_ranks = list(groups["cp"])
        here = cp_ranks.index(rank)
        ring_rank, rank_a2a = here // 2, here % 2
        forward_dst = cp_ranks[(ring_rank + 1) % 4 * 2 + rank_a2a]
        backward_dst = cp_ranks[(ring_rank - 1) % 4 * 2 + rank_a2a]
        for node in nodes_of(spec, rank):
            view = NodeView(node)
            if node.type == pb.COMM_SEND_NODE and view.str("step_part") == "cp":
                assert view.int("comm_dst") == (backward_dst if ".bwd." in node.name else forward_dst)
            if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                key = (view.int("comm_src"), view.int("comm_dst"), view.int("comm_tag"), view.int("comm_size"))
                (sends if node.type == pb.COMM_SEND_NODE else recvs)[key] += 1
            if node.type == pb.COMM_COLL_NODE and view.int("comm_type") == pb.ALL_TO_ALL:
                assert view.str("pg_name") == placement.group_name("cp_a2a", groups["cp_a2a"])
    assert sends == recvs and sends

    def attention_flops(spec: JobSpec) -> int:
        return sum(NodeView(n).int("num_ops") for n in nodes_of(spec, 0)
                   if n.type == pb.COMP_NODE and NodeView(n).str("kernel") == "attention")
    assert attention_flops(spec) == attention_flops(job(8, "p2p", seq=2048))


@pytest.mark.parametrize("parallel, message", [
    ({"cp_comm_type": "a2a+p2p"}, "needs parallel.hierarchical_context_parallel_sizes"),
    ({"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [2, 4]}, "2 x 4 must be cp 4"),
    ({"cp_comm_type": "p2p", "hierarchical_context_parallel_sizes": [2, 2]}, "needs cp_comm_type a2a+p2p"),
    ({"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [4, 1], "tp": 2},
     "both must be divisible by 4"),
])
def test_what_a2a_p2p_refuses(parallel, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        JobSpec.model_validate({"name": "cp", "model": MODEL, "parallel": {"cp": 4, **parallel},
                                "training": {"seq": 1024, "global_batch": 2},
                                "cluster": {"gpus": 4 * parallel.get("tp", 1), "profile": "h100-hgx-ndr400"}})
