"""Symmetry folding: one rank simulated per class of equivalent ranks, the same results as all.

Whatever folding does, a folded run must give the results an unfolded run gives (every rank's
row, every layer's statistics, the warnings); where it cannot prove that, it simulates every
rank and says why.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from chakra_core.engine.folding import find_folding
from chakra_core.comm.groups import group_shape
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.schema import pb
from chakra_core.testing import UniformConfig, UniformNetwork
from chakra_core.tools.generate import generate
from tests.simhelpers import collective, comp, manifest, recv, send, simulate, write_ranks


def _both(prefix: str, network: dict, extra_plugins=(), **sections) -> tuple[dict, dict]:
    folded = simulate(manifest(prefix, network, **sections), extra_plugins=extra_plugins)
    full = simulate(manifest(prefix, network, fold="off", **sections), extra_plugins=extra_plugins)
    return folded, full


def _assert_same(folded: dict, full: dict) -> None:
    assert folded["ranks"] == full["ranks"]
    assert folded["layers"] == full["layers"]
    assert folded["warnings"] == full["warnings"]
    assert folded["finish_ns"] == full["finish_ns"]


def _switch(n: int) -> dict:
    return {"plugin": "analytical", "topology": ["Switch"], "npus_count": [n], "bandwidth": [100.0],
            "latency": [700.0]}


@pytest.mark.parametrize("dp, classes", [(8, 4), (32, 4)])
def test_a_generated_gpt_folds_into_its_pipeline_stages_with_identical_results(tmp_path, dp, classes):
    prefix = tmp_path / "gpt"
    result = CliRunner().invoke(generate, [
        "transformer", "--layers", "4", "--hidden", "64", "--heads", "8", "--seq", "32", "--batch", str(2 * dp),
        "--vocab", "256", "--dp", str(dp), "--tp", "8", "--pp", "4", "--microbatches", "2",
        "--output", str(prefix)])
    assert result.exit_code == 0, result.output
    ranks = dp * 8 * 4            # 256 and 1,024 ranks
    folded, full = _both(str(prefix), _switch(ranks),
                         compute={"plugin": "roofline", "peak_tflops": 312, "memory_bandwidth_gbps": 2039})
    assert folded["folding"]["folded"] and folded["folding"]["classes"] == classes
    assert full["folding"] == {"folded": False, "simulated_ranks": ranks, "reason": "workload.fold is off"}
    assert folded["events"] < full["events"] / 10
    _assert_same(folded, full)


def test_identical_traces_fold_into_one_class(tmp_path):
    nodes = [comp(1, 5), collective(2, pb.ALL_REDUCE, 1 << 20, deps=[1]), comp(3, 2, deps=[2]),
             collective(4, pb.ALL_GATHER, 1 << 16, deps=[3])]
    prefix = write_ranks(tmp_path, [nodes] * 16)
    ring = {"plugin": "analytical", "topology": ["Ring", "Switch"], "npus_count": [4, 4],
            "bandwidth": [200.0, 50.0], "latency": [100.0, 800.0]}
    folded, full = _both(prefix, ring, system={"preferred-dataset-splits": 4,
                                               "collective-optimization": "localBWAware"})
    assert folded["folding"]["representatives"] == {"0": 16}
    _assert_same(folded, full)


def test_a_ring_of_sends_folds_when_the_network_is_a_ring(tmp_path):
    n = 8
    ranks = [[comp(1, 3), send(2, (r + 1) % n, 1 << 18, deps=[1]), recv(3, (r - 1) % n, 1 << 18, deps=[1])]
             for r in range(n)]
    prefix = write_ranks(tmp_path, ranks)
    ring = {"plugin": "analytical", "topology": ["Ring"], "npus_count": [n], "bandwidth": [50.0],
            "latency": [500.0]}
    folded, full = _both(prefix, ring)
    assert folded["folding"]["representatives"] == {"0": 8}
    _assert_same(folded, full)


def test_ranks_whose_traces_differ_are_all_simulated(tmp_path):
    prefix = write_ranks(tmp_path, [[comp(1, r + 1), collective(2, pb.ALL_REDUCE, 64, deps=[1])] for r in range(4)])
    result = simulate(manifest(prefix, _switch(4)))
    assert result["folding"] == {"folded": False, "simulated_ranks": 4, "reason": "no two ranks are equivalent"}


def test_skewed_ranks_form_their_own_classes(tmp_path):
    # ranks 0 and 2 compute longer before the all-reduce: two classes, still exact
    prefix = write_ranks(tmp_path, [[comp(1, 3 if r % 2 else 9), collective(2, pb.ALL_REDUCE, 1 << 20, deps=[1])]
                                    for r in range(8)])
    folded, full = _both(prefix, _switch(8))
    assert folded["folding"]["representatives"] == {"0": 4, "1": 4}
    assert full["ranks"][1]["waiting_ns"] > 0
    _assert_same(folded, full)


class _LopsidedConfig(UniformConfig):
    slow: int


class _Lopsided(UniformNetwork):
    """Contention-free, but messages from one NPU are slower: equivalent traces, not positions."""

    name, fidelity, Config = "lopsided", "one slow NPU", _LopsidedConfig

    def message_delay(self, src, dst, size):
        return (5000 if src == self.config.slow else 500) + size // 50


class _LopsidedPlugin:
    @hookimpl
    def chakra_sim_register_network(self, registry):
        registry.add(_Lopsided)


@pytest.mark.parametrize("pattern", ["collective", "sends"])
def test_a_network_that_treats_equivalent_ranks_differently_unfolds_the_run(tmp_path, pattern):
    n = 8
    if pattern == "collective":
        ranks = [[collective(1, pb.ALL_REDUCE, 1 << 16)] for _ in range(n)]
    else:
        ranks = [[send(1, (r + 1) % n, 4096), recv(2, (r - 1) % n, 4096)] for r in range(n)]
    prefix = write_ranks(tmp_path, ranks)
    plugins = [("lopsided", _LopsidedPlugin())]
    folded, full = _both(prefix, {"plugin": "lopsided", "npus": n, "slow": 3}, extra_plugins=plugins)
    assert not folded["folding"]["folded"]
    assert "simulating every rank" in folded["folding"]["reason"]
    assert any("started over" in w for w in folded["warnings"])
    assert folded["ranks"] == full["ranks"]


def test_a_layer_that_is_not_fold_safe_keeps_every_rank(tmp_path):
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 64)]] * 4)
    result = simulate(manifest(prefix, _switch(4), memory={"plugin": "hbm", "memory-type": "MEMORY_POOL",
                                                           "remote-mem-bw": 50}))
    assert result["folding"]["folded"] is False
    assert "memory plugin 'hbm'" in result["folding"]["reason"]


def test_group_shapes_ignore_where_a_rank_sits_in_a_ring():
    assert group_shape((2, 5, 8, 11), 8) == group_shape((0, 3, 6, 9), 0) == ("ring", 4, 3)
    assert group_shape((0, 1, 5), 1) == ("set", -1, 0, 4)


def test_find_folding_reports_truncated_traces(tmp_path):
    prefix = write_ranks(tmp_path, [[comp(1, 1), comp(2, 1, deps=[1])]] * 4)
    path = tmp_path / "trace.2.et"
    path.write_bytes(path.read_bytes()[:-3])
    from chakra_core.errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="trace.2.et"):
        find_folding([f"{prefix}.{r}.et" for r in range(4)])
