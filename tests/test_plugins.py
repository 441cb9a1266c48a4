"""The plugin contract: discovery, registration, failures, listing, and a real third-party install."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess
import sys
import textwrap
import types

import pytest

from chakra_core.errors import PluginError
from chakra_core.hookspecs import hookimpl
from chakra_core.layers import ComputeModel, NetworkModel, PluginConfig
from chakra_core.plugins import BUILTIN_NAME, make_plugin_host
from tests.simhelpers import MICRO


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
    assert {r["name"]: r["status"] for r in rows}["broken"] == "FAILED"
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
    assert "does not subclass chakra_core.layers.NetworkModel" in failed["wrong"]
    assert "ZeroDivisionError" in failed["raises"]
    assert host.get("compute", "fast").plugin.name == "a_first"


def test_installed_bundled_plugins_are_listed():
    rows = {(r["layer"], r["name"]): r for r in make_plugin_host().listing()}
    assert rows[("network", "analytical")]["distribution"] == "chakra-sim-network-analytical"
    assert rows[("compute", "roofline")]["status"] == "ok"
    assert rows[("system", "native")]["config_schema"]["properties"]["endpoint-delay"]["default"] == 10


THIRD_PARTY = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "acme-fixed-network"
        version = "2.1.0"

        [project.entry-points.chakra_sim]
        acme_fixed = "acme_fixed"
        """,
    "acme_fixed/__init__.py": """
        from pydantic import Field, PositiveInt

        from chakra_core.hookspecs import hookimpl
        from chakra_core.layers import Dimension, NetworkModel, PluginConfig


        class FixedConfig(PluginConfig):
            npus: PositiveInt
            delay_ns: PositiveInt = Field(..., description="every message takes this long")


        class FixedNetwork(NetworkModel):
            name = "fixed"
            fidelity = "every message takes delay_ns, whatever its size"
            Config = FixedConfig
            contention_free = True

            def __init__(self, config, context):
                super().__init__(config, context)
                self.npus_count = config.npus
                self.dims = (Dimension("Switch", config.npus, 1.0, 0.0),)

            def message_delay(self, src, dst, size):
                return self.config.delay_ns

            def send(self, src, dst, size, on_arrival, arg=None):
                self.context.scheduler.schedule(self.config.delay_ns, on_arrival, arg)


        @hookimpl
        def chakra_sim_register_network(registry):
            registry.add(FixedNetwork)
        """,
}


def test_a_third_party_package_installs_and_runs(tmp_path):
    """Build and install a throwaway plugin from its own pyproject, then select it in a manifest."""
    source, target = tmp_path / "src", tmp_path / "site"
    for name, text in THIRD_PARTY.items():
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(textwrap.dedent(f"""
        workload: {{trace: {MICRO / 'all_reduce' / '4npus_1MB' / 'all_reduce'}}}
        system: {{plugin: native, endpoint-delay: 0, local-mem-bw: 1.0e9}}
        network: {{plugin: fixed, npus: 4, delay_ns: 1000}}
        output: {{dir: {tmp_path / 'out'}}}
        """))
    env = {"PYTHONPATH": str(target), "PATH": "", "HOME": str(tmp_path)}
    listing = subprocess.run([sys.executable, "-m", "chakra_core.cli", "plugins", "--json"],
                             capture_output=True, text=True, env=env, check=True)
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["fixed"]["distribution"] == "acme-fixed-network" and rows["fixed"]["version"] == "2.1.0"
    subprocess.run([sys.executable, "-m", "chakra_core.cli", "run", str(manifest), "--quiet"],
                   capture_output=True, text=True, env=env, check=True)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    # ring all-reduce on 4 NPUs: 2(n-1) = 6 steps of 1000 ns, no endpoint or reduction cost
    assert results["finish_ns"] == 6000
    assert results["layers"]["network"]["plugin"] == "fixed"


def test_network_interface_dimension_helper():
    class Two(NetworkModel):
        name, fidelity, Config = "two", "x", PluginConfig

        def send(self, *a):
            pass

    network = Two.__new__(Two)
    from chakra_core.layers import Dimension
    network.dims = (Dimension("Ring", 2, 1, 1), Dimension("Ring", 2, 1, 1), Dimension("Switch", 4, 1, 1))
    assert [network.dim_of(0, d) for d in (1, 2, 3, 4, 12)] == [0, 1, 0, 2, 2]
    with pytest.raises(ValueError):
        network.dim_of(5, 5)


# Extending the system layer and the memory layer through hooks -------------------------------------
from chakra_core.layers import MemoryModel  # noqa: E402
from chakra_core.schema import pb  # noqa: E402
from chakra_core.system.algorithms import ALL_GATHER, CollectiveAlgorithm, StepSchedule  # noqa: E402
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
