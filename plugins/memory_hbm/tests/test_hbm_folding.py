"""Folded runs (one rank simulated per class of equivalent ranks) with the hbm memory layer.

Local HBM folds: a folded run must report what the unfolded run of the same traces reports
(each rank's row, the peak, the run totals counted once per rank). Remote memory types keep
every rank simulated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chakra_core import LayerContext, NodeView, RunInputs, pb
from chakra_core.contract.folding import Folding
from chakra_core.testing import EventQueue, collective, make_node, manifest, simulate, uniform_network, write_ranks
from chakra_sim_memory_hbm import HBMConfig, HBMMemory
from hbm_helpers import MiB, REMOTE
from test_hbm_tensors import CAP_10_MIB, model_trace, op, tensor   # same folder (pytest puts it on sys.path)

WEIGHTED = ("accesses", "local_accesses", "remote_accesses", "bytes_loaded", "bytes_stored",
            "local_sharing_delay_ns", "remote_sharing_delay_ns", "storage_allocations")
"""Run totals that count every rank (a simulated rank once per rank it stands for)."""


@pytest.fixture(autouse=True)
def _needs_installed_plugins(installed_plugins):
    """Every test here runs whole simulations with the bundled plugins."""


def load(node_id: int, storage: int, mib: float, deps=()) -> pb.Node:
    """A MEM_LOAD_NODE bringing in storage `storage` (listed as its output, so it is tracked)."""
    node = make_node(node_id, pb.MEM_LOAD_NODE, data_deps=deps, attrs={"tensor_size": int(mib * MiB)})
    node.outputs.values = f"[{tensor(storage, mib)}]"
    return node


def store(node_id: int, storage: int, mib: float, deps=()) -> pb.Node:
    """A MEM_STORE_NODE writing out storage `storage` (listed as its input)."""
    node = make_node(node_id, pb.MEM_STORE_NODE, data_deps=deps, attrs={"tensor_size": int(mib * MiB)})
    node.inputs.values = f"[{tensor(storage, mib)}]"
    return node


def layer_trace(weights: float, activation: float, micros: int) -> list[pb.Node]:
    """Two concurrent loads (they share the rank's HBM), a kernel reading them and writing an
    activation, a store of the activation, and a kernel on the activation."""
    return [load(1, 200, weights), load(2, 201, weights / 2),
            op(3, "fc", micros, deps=[1, 2], inputs=[tensor(200, weights), tensor(201, weights / 2)],
               outputs=[tensor(100, activation)]),
            store(4, 100, activation, deps=[3]),
            op(5, "relu", micros, deps=[3], inputs=[tensor(100, activation)], outputs=[tensor(101, 1)])]


def with_all_reduce(nodes: list[pb.Node]) -> list[pb.Node]:
    return [*nodes, collective(6, pb.ALL_REDUCE, 1 << 20, deps=[4, 5])]


def run(tmp_path: Path, ranks: list[list[pb.Node]], fold: str, **memory) -> dict:
    prefix = write_ranks(tmp_path / fold, ranks)
    data = manifest(prefix, uniform_network(len(ranks)), compute={"plugin": "replay"},
                    memory={"plugin": "hbm", "bandwidth_gbps": 100, **memory}, fold=fold,
                    resources={"memory": 2})
    return simulate(data, base_dir=tmp_path)


def both(tmp_path: Path, ranks: list[list[pb.Node]], **memory) -> tuple[dict, dict]:
    return run(tmp_path, ranks, "auto", **memory), run(tmp_path, ranks, "off", **memory)


def assert_folded_equals_full(folded: dict, full: dict) -> None:
    assert folded["folding"]["folded"] and not full["folding"]["folded"]
    assert folded["ranks"] == full["ranks"]          # every rank's row, "hbm" included
    summary, full_summary = folded["layers"]["memory"]["summary"], full["layers"]["memory"]["summary"]
    for key in (*WEIGHTED, "peak_memory_bytes"):
        assert summary[key] == full_summary[key], key
    # the series of the simulated ranks are those ranks' series in the full run
    simulated = list(folded["folding"]["representatives"])
    assert list(summary["memory_series"]) == simulated
    assert summary["memory_series"] == {rank: full_summary["memory_series"][rank] for rank in simulated}
    assert folded["warnings"] == full["warnings"]


@pytest.mark.parametrize("lifetime", ["trace", "issued"])
def test_unequal_classes_fold_with_every_total_weighted(tmp_path, lifetime):
    """Ranks 0-3 run one program, ranks 4-5 another: classes of 4 and 2 ranks."""
    ranks = [layer_trace(4, 2, 10)] * 4 + [layer_trace(8, 6, 20)] * 2
    folded, full = both(tmp_path, ranks, lifetime=lifetime)
    assert folded["folding"]["representatives"] == {"0": 4, "4": 2}
    assert_folded_equals_full(folded, full)
    summary = folded["layers"]["memory"]["summary"]
    assert summary["local_accesses"] == 6 * 3 and summary["remote_accesses"] == 0
    assert summary["bytes_loaded"] == 4 * 6 * MiB + 2 * 12 * MiB
    assert summary["bytes_stored"] == 4 * 2 * MiB + 2 * 6 * MiB
    assert summary["local_sharing_delay_ns"] > 0          # the two loads shared the HBM
    assert summary["peak_memory_bytes"] == max(r["hbm"]["peak_memory_bytes"] for r in full["ranks"])
    assert (summary["ranks_without_tensors"], summary["lifetime_fallback_ranks"]) == ([], [])
    assert summary["pre_pass_ranks"] == (2 if lifetime == "trace" else 0)   # simulated ranks only


def test_ranks_in_step_through_a_collective_fold(tmp_path):
    """SPMD with communication: even and odd ranks differ, an all-reduce joins them."""
    ranks = [with_all_reduce(layer_trace(4, 2, 10) if r % 2 else layer_trace(2, 1, 30)) for r in range(8)]
    folded, full = both(tmp_path, ranks)
    assert folded["folding"]["representatives"] == {"0": 4, "1": 4}
    assert_folded_equals_full(folded, full)
    assert folded["layers"]["memory"] == {**full["layers"]["memory"],
                                          "summary": folded["layers"]["memory"]["summary"],
                                          "highlights": folded["layers"]["memory"]["highlights"]}


def test_unfolded_runs_count_every_rank_once(tmp_path):
    """fold: off is the reference above; its totals are plain sums over the ranks."""
    ranks = [layer_trace(4, 2, 10)] * 3
    full = run(tmp_path, ranks, "off")
    summary = full["layers"]["memory"]["summary"]
    assert summary["bytes_loaded"] == sum(r["hbm"]["memory_bytes_loaded"] for r in full["ranks"]) == 18 * MiB
    assert summary["local_accesses"] == 9
    assert list(summary["memory_series"]) == ["0", "1", "2"]


def test_ranks_that_are_not_simulated_are_not_reported_without_tensors(tmp_path):
    plain = [make_node(1, pb.COMP_NODE, duration_micros=5)]
    ranks = [model_trace()] * 3 + [plain] * 3
    folded, full = both(tmp_path, ranks)
    assert folded["folding"]["representatives"] == {"0": 3, "3": 3}
    assert [r["hbm"]["peak_memory_bytes"] for r in folded["ranks"]] == [16 * MiB] * 3 + [None] * 3
    assert [r["hbm"] for r in folded["ranks"]] == [r["hbm"] for r in full["ranks"]]
    assert full["layers"]["memory"]["summary"]["ranks_without_tensors"] == [3, 4, 5]
    assert folded["layers"]["memory"]["summary"]["ranks_without_tensors"] == [3]
    assert folded["layers"]["memory"]["summary"]["peak_memory_bytes"] == 16 * MiB
    (warning,) = folded["warnings"]
    assert warning.startswith("memory plugin 'hbm', rank(s) 3 and the ranks equivalent to them: "
                              "no node listed a device tensor")
    (full_warning,) = full["warnings"]
    assert full_warning.startswith("memory plugin 'hbm', rank(s) 3, 4, 5: no node listed a device tensor")
    for text in (warning, full_warning):    # the run's peak is known: only theirs is null
        assert "their peak_memory_bytes is null" in text


def test_every_rank_without_tensors_folded_says_every_rank(tmp_path):
    ranks = [[make_node(1, pb.COMP_NODE, duration_micros=5)]] * 4
    folded, full = both(tmp_path, ranks)
    assert folded["folding"]["representatives"] == {"0": 4}
    assert folded["layers"]["memory"]["summary"]["ranks_without_tensors"] == [0]
    assert folded["layers"]["memory"]["summary"]["peak_memory_bytes"] is None
    assert folded["warnings"] == full["warnings"]
    (warning,) = folded["warnings"]
    assert warning.startswith("memory plugin 'hbm', every rank: no node listed a device tensor")
    assert "; peak_memory_bytes is null" in warning


def test_the_no_tensors_warning_names_the_nodes_that_count(tmp_path):
    """With tensor_nodes: cpu, GPU nodes that list tensors do not count: the warning must not say
    that no node listed one."""
    results = run(tmp_path, [model_trace()], "off", tensor_nodes="cpu")
    (warning,) = results["warnings"]
    assert "every rank: no CPU operation listed a device tensor" in warning
    assert "tensor_nodes: cpu ignores all but CPU operations" in warning


def test_oom_in_a_folded_run_names_the_equivalent_ranks(tmp_path):
    folded, full = both(tmp_path, [model_trace()] * 4, capacity_gib=CAP_10_MIB)
    (warning,) = [w for w in folded["warnings"] if "out of memory" in w]
    assert warning.startswith("memory plugin 'hbm': rank 0 (and the 3 rank(s) equivalent to it) is out of "
                              "memory at node 2 ('fc1'), t=10000 ns")
    assert len([w for w in full["warnings"] if "out of memory" in w]) == 4
    assert folded["layers"]["memory"]["summary"]["oom_ranks"] == [0]
    assert full["layers"]["memory"]["summary"]["oom_ranks"] == [0, 1, 2, 3]
    assert folded["ranks"] == full["ranks"]


def test_terminal_table_of_a_folded_run_lists_the_simulated_ranks(tmp_path):
    folded = run(tmp_path, [model_trace()] * 4, "auto")
    (table,) = folded["layers"]["memory"]["highlights"]
    assert table["title"] == "peak memory (tracked tensors) — simulated ranks, one per class of equivalent ranks"
    assert table["rows"] == [["0", "16,777,216", "0.016", "20.000"]]


@pytest.mark.parametrize("memory", [
    {"memory-type": "MEMORY_POOL", **REMOTE},
    {"memory-type": "PER_NODE_MEMORY_EXPANSION", "num-npus-per-node": 2, **REMOTE},
    {"memory-type": "MEMORY_POOL", "pool_sharing": "fair", **REMOTE},
])
def test_shared_remote_memory_keeps_every_rank_simulated(tmp_path, memory):
    results = run(tmp_path, [layer_trace(4, 2, 10)] * 4, "auto", **memory)
    assert results["folding"]["folded"] is False
    assert results["folding"]["reason"] == ("memory plugin 'hbm' cannot stand one rank for another "
                                            "(fold_safe is false)")
    assert list(results["layers"]["memory"]["summary"]["memory_series"]) == ["0", "1", "2", "3"]
    assert results["layers"]["memory"]["summary"]["remote_accesses"] == 4 * 3


@pytest.mark.parametrize("pool_sharing", ["fifo", "fair"])
def test_per_npu_expansion_folds_as_unfolded(tmp_path, pool_sharing):
    """A per-NPU expansion is each rank's own (a job's host memory for activation offload): a folded
    run simulates one rank per class and gives the unfolded run's times and totals."""
    memory = {"memory-type": "PER_NPU_MEMORY_EXPANSION", "pool_sharing": pool_sharing, **REMOTE}
    folded, full = both(tmp_path, [layer_trace(4, 2, 10)] * 4, **memory)
    assert_folded_equals_full(folded, full)
    assert folded["layers"]["memory"]["summary"]["remote_accesses"] == 4 * 3


@pytest.mark.parametrize("memory_type, safe", [("NO_MEMORY_EXPANSION", True), ("PER_NPU_MEMORY_EXPANSION", True),
                                               ("PER_NODE_MEMORY_EXPANSION", False), ("MEMORY_POOL", False)])
def test_fold_safe_per_instance(memory_type, safe):
    settings = {"memory-type": memory_type, "num-npus-per-node": 2, **REMOTE}
    model = HBMMemory(HBMConfig.model_validate(settings), LayerContext(num_ranks=4, scheduler=EventQueue()))
    assert model.fold_safe is safe
    assert HBMMemory.fold_safe is False          # the class default is untouched


def test_a_rank_that_was_not_simulated_gets_its_representatives_row():
    """The engine asks only the simulated ranks' rows (and copies them); asked for another rank,
    the model answers with its representative's, not with a rank that issued nothing."""
    folding = Folding.of([0, 1, 0, 1], [()] * 4)
    context = LayerContext(num_ranks=4, scheduler=EventQueue(), inputs=RunInputs(folding=folding))
    model = HBMMemory(HBMConfig(lifetime="issued"), context)
    node = make_node(1, pb.COMP_NODE)
    node.inputs.values = f"[{tensor(5, 2)}]"
    model.node_issued(1, NodeView(node), 0)
    model.node_completed(1, NodeView(node), 7)
    assert model.rank_summary(3) == model.rank_summary(1) == {
        "memory_bytes_loaded": 0, "memory_bytes_stored": 0, "peak_memory_bytes": 2 * MiB, "peak_memory_ns": 0}
    assert model.summary()["storage_allocations"] == 2            # rank 1 stands for ranks 1 and 3
    assert list(model.summary()["memory_series"]) == ["0", "1"]
