"""How a run ends: it releases its traces however it ends (success, a plugin error, a deadlock,
Ctrl-C), and a system layer's on_idle cannot keep it spinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from chakra_core.engine.simulation import Simulation
from chakra_core.errors import DeadlockError, PluginError, TraceFormatError
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.layers import ComputeModel, PluginConfig
from chakra_core.system.native.layer import NativeSystem
from chakra_core.run import load, prepare
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from chakra_core.testing import TESTING_PLUGIN, collective, comp, manifest, uniform_network, write_ranks


class _Raising(ComputeModel):
    name = "raising"
    fidelity = "raises on node 2"
    Config = PluginConfig
    error: BaseException = ZeroDivisionError("bad kernel")

    def compute_time_ns(self, rank, node):
        if node.id == 2:
            raise self.error
        return 1


class _RaisingPlugin:
    @hookimpl
    def chakra_sim_register_compute(self, registry):
        registry.add(_Raising)


def _simulation(tmp_path: Path, ranks, compressed: bool = False, **sections) -> Simulation:
    prefix = write_ranks(tmp_path / "t", ranks)
    if compressed:     # the streaming feeder inflates gzip traces into a temporary folder
        import gzip
        for rank in range(len(ranks)):
            path = Path(f"{prefix}.{rank}.et")
            path.write_bytes(gzip.compress(path.read_bytes()))
    host = make_plugin_host(extra_plugins=[TESTING_PLUGIN, ("raising-plugin", _RaisingPlugin())])
    # fold off: every rank gets its own feeder (folding opens one per class; tested below)
    config = load(manifest(prefix, uniform_network(len(ranks)), fold="off", **sections), host,
                  base_dir=tmp_path, name="test")
    return prepare(config, host).simulation


def _assert_released(sim: Simulation, ranks: int) -> None:
    assert len(sim.drivers) == ranks
    for driver in sim.drivers:
        trace = driver.feeder._trace      # the index, shared by ranks with identical files
        assert trace._file is None and trace._tmp_dir is None and trace.users == 0


@pytest.mark.parametrize("compressed", [False, True])
def test_a_plugin_error_mid_run_closes_every_feeder(tmp_path, compressed):
    sim = _simulation(tmp_path, [[comp(1, 1), comp(2, 1, deps=[1])]] * 2, compressed,
                      compute={"plugin": "raising"})
    with pytest.raises(PluginError, match="raising-plugin.*ZeroDivisionError"):
        sim.run()
    _assert_released(sim, 2)


def test_keyboard_interrupt_closes_every_feeder(tmp_path, monkeypatch):
    monkeypatch.setattr(_Raising, "error", KeyboardInterrupt())
    sim = _simulation(tmp_path, [[comp(1, 1), comp(2, 1, deps=[1])]] * 2, compute={"plugin": "raising"})
    with pytest.raises(KeyboardInterrupt):
        sim.run()
    _assert_released(sim, 2)


def test_a_deadlock_closes_every_feeder(tmp_path):
    sim = _simulation(tmp_path, [[collective(1, pb.ALL_REDUCE, 64)], [comp(1, 1)]])
    with pytest.raises(DeadlockError):
        sim.run()
    _assert_released(sim, 2)


def test_a_bad_trace_closes_the_feeders_opened_before_it(tmp_path):
    sim = _simulation(tmp_path, [[comp(1, 1)]] * 3)
    Path(sim.spec.trace_files[2]).write_bytes(b"\xff\xff\xff")
    with pytest.raises(TraceFormatError):
        sim.run()
    _assert_released(sim, 2)


def test_a_successful_run_closes_every_feeder(tmp_path):
    sim = _simulation(tmp_path, [[comp(1, 1)]] * 2)
    assert [rank.finish_ns for rank in sim.run().ranks] == [1000, 1000]
    _assert_released(sim, 2)


class _Hopeful(NativeSystem):
    """Claims on_idle made progress without scheduling anything."""

    name = "hopeful"
    calls = 0

    def on_idle(self):
        type(self).calls += 1
        if self.calls > 100:
            raise RuntimeError("on_idle called forever")
        return True


class _HopefulPlugin:
    @hookimpl
    def chakra_sim_register_system(self, registry):
        registry.add(_Hopeful)


def test_on_idle_returning_true_without_events_ends_in_a_deadlock_report(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[collective(1, pb.ALL_REDUCE, 64)], [comp(1, 1)]])
    host = make_plugin_host(extra_plugins=[TESTING_PLUGIN, ("hopeful-plugin", _HopefulPlugin())])
    data = manifest(prefix, uniform_network(2))
    data["system"] = {"plugin": "hopeful"}
    sim = prepare(load(data, host, base_dir=tmp_path, name="test"), host).simulation
    with pytest.raises(DeadlockError, match="rank 0"):
        sim.run()
    assert _Hopeful.calls == 1


def test_a_folded_run_closes_the_feeders_it_opened(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[collective(1, pb.ALL_REDUCE, 64)]] * 4)
    host = make_plugin_host(extra_plugins=[TESTING_PLUGIN])
    sim = prepare(load(manifest(prefix, uniform_network(4)), host, base_dir=tmp_path, name="test"), host).simulation
    assert sim.run().folding is not None
    _assert_released(sim, 1)
