"""The plugin contract: discovery, registration, failures, listing, and a real third-party install."""

from __future__ import annotations

import importlib.metadata as metadata
import sys
import types

import pytest

from chakra_core.errors import PluginError
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.contract.layers import ComputeModel, PluginConfig
from chakra_core.contract.network import NetworkModel
from chakra_core.plugins import BUILTIN_NAME, make_plugin_host


class _Fast(ComputeModel):
    name = "fast"
    fidelity = "every kernel takes 1 ns"
    Config = PluginConfig

    def compute_time_ns(self, rank, node):
        return 1


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _entry_point(name: str, module: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=module, group="chakra_sim")


@hookimpl
def _register_fast(registry):
    registry.add(_Fast)


def test_builtins_register_through_the_hooks():
    host = make_plugin_host(entry_points=[])
    assert host.get("system", "native").plugin.name == BUILTIN_NAME
    assert host.get("compute", "replay").plugin.distribution == "chakra-sim"
    assert "ring" in host.algorithms()


def test_entry_points_load_one_by_one_and_failures_are_recorded():
    _module("good_plugin_mod", chakra_sim_register_compute=_register_fast)
    _module("typo_plugin_mod", chakra_sim_register_compte=hookimpl(lambda registry: None))
    eps = [_entry_point("good", "good_plugin_mod"), _entry_point("broken", "no_such_module_xyz"),
           _entry_point("typo", "typo_plugin_mod")]
    host = make_plugin_host(entry_points=eps)
    assert host.get("compute", "fast").plugin.name == "good"
    failed = {info.name: info.error for info in host.failed()}
    assert set(failed) == {"broken", "typo"}
    assert "ModuleNotFoundError" in failed["broken"]
    assert "chakra_sim_register_compte" in failed["typo"]      # unknown hook name caught
    rows = host.listing()
    assert {r.name: r.status for r in rows}["broken"] == "FAILED"
    # A failed plugin only matters when the manifest asks for something missing:
    with pytest.raises(PluginError, match="no compute plugin named 'roof'.*installed compute plugins: "
                                          "fast, replay.*'broken'.*ModuleNotFoundError"):
        host.get("compute", "roof")


def test_registry_rejects_bad_classes_and_duplicates():
    class NoFidelity(ComputeModel):
        name = "nofid"
        Config = PluginConfig

        def compute_time_ns(self, rank, node):
            return 0

    class NotANetwork:
        name = "x"
        fidelity = "x"

    _module("good_plugin_mod", chakra_sim_register_compute=_register_fast)
    plugins = {
        "dup": _module("dup_mod", chakra_sim_register_compute=hookimpl(lambda registry: registry.add(_Fast))),
        "nofid": _module("nofid_mod", chakra_sim_register_compute=hookimpl(lambda registry: registry.add(NoFidelity))),
        "wrong": _module("wrong_mod", chakra_sim_register_network=hookimpl(lambda registry: registry.add(NotANetwork))),
        "raises": _module("raises_mod", chakra_sim_register_memory=hookimpl(lambda registry: 1 / 0)),
    }
    host = make_plugin_host(entry_points=[_entry_point("a_first", "good_plugin_mod")] +
                            [_entry_point(name, f"{name}_mod") for name in plugins])
    failed = {info.name: info.error for info in host.failed()}
    assert "registered twice: by 'a_first' and by 'dup'" in failed["dup"]
    assert "needs a non-empty string class attribute 'fidelity'" in failed["nofid"]
    assert "does not subclass chakra_core.NetworkModel" in failed["wrong"]
    assert "ZeroDivisionError" in failed["raises"]
    assert host.get("compute", "fast").plugin.name == "a_first"


def test_installed_bundled_plugins_are_listed():
    rows = {(r.layer, r.name): r.to_json() for r in make_plugin_host().listing()}
    assert rows[("network", "analytical")]["distribution"] == "chakra-sim-network-analytical"
    assert rows[("compute", "roofline")]["status"] == "ok"
    assert rows[("system", "native")]["config_schema"]["properties"]["endpoint-delay"]["default"] == 10


def test_an_extra_plugin_already_loaded_from_its_entry_point_is_not_registered_twice():
    module = _module("installed_plugin_mod", chakra_sim_register_compute=_register_fast)
    host = make_plugin_host(entry_points=[_entry_point("installed", "installed_plugin_mod")],
                            extra_plugins=[("installed", module)])
    assert host.failed() == []
    assert host.get("compute", "fast").plugin.name == "installed"


# The third-party package of docs/writing-a-plugin.md is built, installed and run by
# tests/test_plugin_guide.py, from the guide's own code blocks.


def test_network_interface_dimension_helper():
    class Two(NetworkModel):
        name, fidelity, Config = "two", "x", PluginConfig

        def send(self, *a):
            pass

    network = Two.__new__(Two)
    from chakra_core.contract.network import Dimension
    network.dims = (Dimension("Ring", 2, 1, 1), Dimension("Ring", 2, 1, 1), Dimension("Switch", 4, 1, 1))
    assert [network.dim_of(0, d) for d in (1, 2, 3, 4, 12)] == [0, 1, 0, 2, 2]
    with pytest.raises(ValueError):
        network.dim_of(5, 5)


# Extending the system layer and the memory layer through hooks -------------------------------------
from chakra_core.comm.collectives import ALL_GATHER  # noqa: E402
from chakra_core.contract.algorithm import CollectiveAlgorithm, StepSchedule  # noqa: E402
from chakra_core.contract.layers import MemoryModel  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from tests.helpers import make_node  # noqa: E402
from tests.simhelpers import collective, hop_ns, manifest, ring_network, simulate, write_ranks  # noqa: E402


class _DirectAllGather(CollectiveAlgorithm):
    """Every member sends its whole chunk to every other member in one step."""

    name = "direct_test"
    supports = frozenset({ALL_GATHER})

    def step_schedule(self, comm_type, chunk_bytes, n):
        return StepSchedule(n, (chunk_bytes,), (False,),
                            lambda pos, step: tuple(p for p in range(n) if p != pos))


class _AlgorithmPlugin:
    @hookimpl
    def chakra_sim_register_system(self, registry):
        registry.add_algorithm(_DirectAllGather)


def test_an_algorithm_registered_by_a_plugin_is_selected_by_name(tmp_path):
    n, size = 4, 1 << 16
    prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_GATHER, size)]] * n)
    network = ring_network(n, topology="FullyConnected")
    system = {"all-gather-implementation": ["direct_test"], "endpoint-delay": 10}
    results = simulate(manifest(prefix, network, system=system),
                       extra_plugins=[("algo", _AlgorithmPlugin())])
    assert results["finish_ns"] == 10 + hop_ns(size) + 10
    assert {r["bytes_sent"] for r in results["ranks"]} == {(n - 1) * size}


class _FlatMemory(MemoryModel):
    name = "flat"
    fidelity = "every access takes 100 ns"
    Config = PluginConfig

    def bandwidth_gbps(self, rank):
        return 1.0

    def access(self, rank, node, done):
        self.context.scheduler.schedule(100, done, node.id)


class _MemoryPlugin:
    @hookimpl
    def chakra_sim_register_memory(self, registry):
        registry.add(_FlatMemory)


def test_a_memory_model_registered_by_a_plugin_times_memory_nodes(tmp_path):
    nodes = [make_node(1, pb.MEM_LOAD_NODE, attrs={"tensor_size": 8}),
             make_node(2, pb.MEM_STORE_NODE, data_deps=[1], attrs={"tensor_size": 8})]
    prefix = write_ranks(tmp_path, [nodes] * 2)
    results = simulate(manifest(prefix, ring_network(2), memory={"plugin": "flat"}),
                       extra_plugins=[("mem", _MemoryPlugin())])
    assert results["finish_ns"] == 200
    assert results["ranks"][0]["memory_ns"] == 200


# Commands, network fast paths, ASTRA-sim equivalents ----------------------------------------------
import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from chakra_core.cli import main  # noqa: E402
from chakra_core.contract.layers import AstraEquivalent  # noqa: E402
from chakra_core.errors import ManifestError  # noqa: E402


@click.command("hello")
@click.option("--name", default="world")
def _hello(name):
    """Say hello (a plugin's command)."""
    click.echo(f"hello {name}")


@click.command("run")
def _another_run():
    """Takes a name chakra-sim uses."""


class _CommandPlugin:
    @hookimpl
    def chakra_sim_register_commands(self, registry):
        registry.add(_hello)


def test_a_plugin_adds_a_command_through_register_commands(monkeypatch):
    _module("clash_command_mod", chakra_sim_register_commands=hookimpl(lambda registry: registry.add(_another_run)))
    host = make_plugin_host(entry_points=[_entry_point("clash", "clash_command_mod")],
                            extra_plugins=[("greeter", _CommandPlugin())])
    assert host.failed() == []                      # commands register only when asked for
    commands = host.commands(reserved=frozenset({"run"}))
    assert list(commands) == ["hello"]
    assert "command 'run' is one of chakra-sim's own" in {i.name: i.error for i in host.failed()}["clash"]
    monkeypatch.setattr("chakra_core.plugins.make_plugin_host",
                        lambda: make_plugin_host(extra_plugins=[("greeter", _CommandPlugin())]))
    main._plugins = None   # the group caches what it found
    try:
        listed = CliRunner().invoke(main, ["--help"])
        assert "hello" in listed.output and "Say hello" in listed.output
        result = CliRunner().invoke(main, ["hello", "--name", "chakra"])
        assert result.exit_code == 0 and result.output == "hello chakra\n"
    finally:
        main._plugins = None


def test_a_contention_free_network_must_say_how_long_a_message_takes():
    class Loose(NetworkModel):
        name, fidelity, Config = "loose", "x", PluginConfig
        contention_free = True

        def send(self, *a):
            pass

    _module("loose_mod", chakra_sim_register_network=hookimpl(lambda registry: registry.add(Loose)))
    host = make_plugin_host(entry_points=[_entry_point("loose", "loose_mod")])
    assert "sets contention_free but has no message_delay" in host.failed()[0].error


class _Roofline2(_Fast):
    name = "roofline_two"
    astra_sim = AstraEquivalent("roofline", {"peak-perf": "peak_tflops"})


def test_a_system_file_selects_the_one_plugin_standing_for_astra_sims_roofline(tmp_path):
    (tmp_path / "sys.json").write_text('{"roofline-enabled": 1, "peak-perf": 100, "local-mem-bw": 1600}')
    prefix = write_ranks(tmp_path, [[make_node(1, pb.COMP_NODE)]] * 2)
    data = {"workload": {"trace": prefix}, "system": {"plugin": "native", "astra_file": str(tmp_path / "sys.json")},
            "network": ring_network(2)}
    assert simulate(data)["layers"]["compute"]["plugin"] == "roofline"
    with pytest.raises(ManifestError, match="roofline-enabled: selects ASTRA-sim's roofline compute model, "
                                            "which several compute plugins implement .roofline, roofline_two."):
        simulate(data, extra_plugins=[("second", _module("second_roofline_mod", chakra_sim_register_compute=hookimpl(
            lambda registry: registry.add(_Roofline2))))])
