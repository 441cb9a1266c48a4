"""A job's placement at scale (issue 33): its arithmetic groups equal the groups materialised from
Megatron's rank order, each group is one tuple its members share (so a folded run of 131,072
ranks holds each group once and finds a class mate's group by identity), and a cluster above
CHAKRA_SIM_MAX_RANKS is refused before any work."""

from __future__ import annotations

from collections import Counter
from itertools import product
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chakra_core.comm.groups import GroupRegistry
from chakra_core.contract.folding import Folding
from chakra_core.errors import ManifestError
from chakra_core.jobs.expand import read_job
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec

MODEL = {"layers": 8, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}


def spec(tp: int, cp: int, pp: int, dp: int, tied: bool = False, precision: str = "bf16") -> dict[str, Any]:
    return {"name": "t", "model": {**MODEL, "tied_embeddings": tied}, "parallel": {"tp": tp, "pp": pp, "cp": cp},
            "training": {"seq": 2048, "global_batch": dp, "precision": precision},
            "cluster": {"gpus": tp * cp * pp * dp, "profile": "h100-hgx-ndr400"}}


def materialised(tp: int, cp: int, pp: int, dp: int, tied: bool, fp8: bool) -> list[dict[str, tuple[int, ...]]]:
    """Every rank's groups, found by enumerating Megatron's coordinates (tp fastest, then cp,
    dp, pp) and grouping ranks that share the other coordinates."""
    rank_of = {(t, c, d, p): t + tp * (c + cp * (d + dp * p))
               for t, c, d, p in product(range(tp), range(cp), range(dp), range(pp))}
    out: list[dict[str, tuple[int, ...]]] = [{} for _ in rank_of]
    for (t, c, d, p), rank in rank_of.items():
        same = {"tp": lambda k: k[1:] == (c, d, p), "cp": lambda k: (k[0], k[2], k[3]) == (t, d, p),
                "dp_cp": lambda k: (k[0], k[3]) == (t, p),
                "emb": lambda k: k[:3] == (t, c, d) and k[3] in (0, pp - 1), "amax": lambda k: k[3] == p}
        wanted = {"tp": tp > 1, "cp": cp > 1, "dp_cp": dp * cp > 1, "emb": pp > 1 and tied and p in (0, pp - 1),
                  "amax": fp8 and tp * cp * dp > 1}
        for role, test in same.items():
            if wanted[role]:
                out[rank][role] = tuple(sorted(r for k, r in rank_of.items() if test(k)))
    return out


layouts = st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]),
                    st.integers(1, 16), st.booleans(), st.booleans()).filter(
                        lambda layout: layout[0] * layout[1] * layout[2] * layout[3] <= 512)


@settings(max_examples=60, deadline=None)
@given(layouts, st.sampled_from([2, 4, 8]))
def test_arithmetic_groups_are_the_materialised_ones_and_shared(layout, gpus_per_node):
    tp, cp, pp, dp, tied, fp8 = layout
    job = JobSpec.model_validate(spec(tp, cp, pp, dp, tied, "fp8" if fp8 else "bf16"))
    placement = Placement(job, gpus_per_node)
    expected = materialised(tp, cp, pp, dp, tied, fp8)
    groups = [placement.groups(rank) for rank in range(placement.world)]
    assert groups == expected               # same roles, same order, same members
    for rank, own in enumerate(groups):
        for role, members in own.items():   # one tuple per group, whichever member asks
            assert all(placement.groups(m)[role] is members for m in members)
    # where(): per role, nodes a group spans and its most GPUs on one node, counted directly
    sample = {**expected[placement.representatives[-1]], **expected[0]}
    rows = {row.group: row for row in placement.where()}
    for role, members in sample.items():
        per_node = Counter(m // gpus_per_node for m in members)
        assert (rows[role].ranks, rows[role].nodes, rows[role].gpus_per_node) == \
               (len(members), len(per_node), max(per_node.values()))


@settings(max_examples=40, deadline=None)
@given(layouts)
def test_corresponding_groups_found_by_identity_are_those_found_by_value(layout):
    """Folding.corresponding answers as `groups_of[rank][groups_of[rep].index(group)]` does,
    with the group asked about an equal tuple from elsewhere (a trace's definition), and with
    equal groups of two roles (tp 1: dp_cp and amax are the whole stage)."""
    tp, cp, pp, dp, tied, fp8 = layout
    placement = Placement(JobSpec.model_validate(spec(tp, cp, pp, dp, tied, "fp8" if fp8 else "bf16")), 8)
    representative = [placement.representative(r) for r in range(placement.world)]
    groups_of = [tuple(placement.groups(r).values()) for r in range(placement.world)]
    folding = Folding.of(representative, groups_of)
    for rep in placement.representatives:
        for group in groups_of[rep]:
            asked = tuple(list(group))     # equal, not identical
            for _ in range(2):             # the second time through the alias
                for mate in folding.members[rep]:
                    by_value = groups_of[mate][groups_of[rep].index(asked)]
                    assert folding.corresponding(asked, rep, mate) is by_value
    with pytest.raises(ValueError):        # a group the rank does not use
        folding.corresponding((placement.world + 1,), 0, 0)


@settings(max_examples=80, deadline=None)
@given(layouts, st.sampled_from([2, 4, 8]))
def test_ring_attention_folds_ranks_whose_rings_cross_alike_and_is_matched_by_ring_position(layout, gpus_per_node):
    """CP ranks c and c' of a stage fold together exactly when every ring (next rank of the CP
    group, the last wrapping to the first), turned by c' - c, crosses between nodes at the same
    places; then a representative's message to its ring successor stands, for each class mate,
    for the mate's own successor, and is received as the message from the successor's
    representative's predecessor."""
    tp, cp, pp, dp, tied, _ = layout
    placement = Placement(JobSpec.model_validate(spec(tp, cp, pp, dp, tied)), gpus_per_node)
    rings = [placement.groups(rank).get("cp", (rank,)) for rank in range(placement.world)]
    crossing = {tuple(placement.node(a) == placement.node(b) for a, b in zip(ring, ring[1:] + ring[:1]))
                for ring in set(rings)}
    for rank in range(placement.world):
        rep = placement.representative(rank)
        assert placement.coord(rep).pp == placement.coord(rank).pp
        turn = (placement.coord(rank).cp - placement.coord(rep).cp) % cp
        if turn:
            pattern = next(iter(crossing))
            assert len(crossing) == 1 and pattern == pattern[turn:] + pattern[:turn]
    if len(crossing) == 1 and len(set(next(iter(crossing)))) == 1:   # all within a node, or all across
        assert all(placement.coord(rep).cp == 0 for rep in placement.representatives)
    representative = [placement.representative(r) for r in range(placement.world)]
    folding = Folding.of(representative, [tuple(placement.groups(r).values()) for r in range(placement.world)],
                         placement.cp_rings)
    for rep in placement.representatives:
        if cp > 1:
            ring = rings[rep]
            after = ring[(ring.index(rep) + 1) % cp]
            peers = dict(folding.pairs(rep, after))
            assert list(peers) == folding.members[rep]
            for mate in folding.members[rep]:
                own = rings[mate]
                assert peers[mate] == own[(own.index(mate) + 1) % cp]
            target = representative[after]
            theirs = rings[target]
            assert folding.matched_source(rep, after) == theirs[(theirs.index(target) - 1) % cp]
        if pp > 1:   # the next stage's representative: its peer at a fixed offset, received as sent
            nxt = placement.peer(rep, 1)
            assert folding.matched_source(rep, nxt) == rep
            assert folding.pairs(rep, nxt) == tuple((mate, placement.peer(mate, 1)) for mate in folding.members[rep])


def test_a_group_defined_again_keeps_its_first_tuple():
    registry = GroupRegistry(8)
    registry.define("g", [0, 2, 4], "rank 0")
    first = registry.defined()["g"][0]
    registry.define("g", [4, 2, 0], "rank 2")
    assert registry.defined()["g"][0] is first


def test_more_gpus_than_the_rank_limit_are_refused_before_any_work(monkeypatch):
    huge = spec(4, 2, 4, 312_500)          # 10,000,000 GPUs
    with pytest.raises(ManifestError) as caught:
        read_job(huge, "job.yaml")
    where, why = caught.value.problems[0]
    assert where == "job.yaml: job.cluster.gpus"
    assert "10,000,000" in why and "131,072" in why and "CHAKRA_SIM_MAX_RANKS" in why
    assert read_job(spec(4, 2, 4, 4096), "job.yaml").cluster.gpus == 131_072   # the limit itself runs
    monkeypatch.setenv("CHAKRA_SIM_MAX_RANKS", "16")
    with pytest.raises(ManifestError, match="32 GPUs"):
        read_job(spec(2, 2, 2, 4), "job.yaml")
