"""pytest fixtures for plugin authors, loaded by pytest wherever chakra-sim is installed
(entry point `chakra_sim` in the `pytest11` group): a plugin's test suite uses them with no
conftest and nothing from this repository.

    def test_my_network(chakra_trace, chakra_run):
        prefix = chakra_trace([[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 4)
        results = chakra_run(manifest(prefix, {"plugin": "mine", "npus": 4}), extra_plugins=[("mine", my_plugin)])
        assert results["finish_ns"] > 0

- `chakra_trace(ranks, name="trace")`: writes `<tmp_path>/<name>.<rank>.et`, one per node list,
  and returns the prefix for `workload.trace`;
- `chakra_run(data, extra_plugins=(), host=None)`: validates and runs a manifest mapping (relative
  paths against the test's tmp_path) and returns the results document;
- `chakra_host(extra_plugins=())`: a fresh plugin host with the installed plugins, the
  `testing_uniform` network and your in-process plugins;
- `chakra_installed(layer, name)`: skips the test unless that implementation is installed
  (for tests that need another distribution's plugin).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import pytest

if TYPE_CHECKING:   # the fixtures import chakra-sim when used: loading this plugin costs any suite nothing
    from chakra_core.json_types import JsonObject, JsonValue
    from chakra_core.plugins import PluginHost
    from chakra_core.schema import pb


@pytest.fixture
def chakra_trace(tmp_path: Path) -> Callable[..., str]:
    """Factory: `chakra_trace([nodes of rank 0, nodes of rank 1, ...], name="trace")` -> prefix."""
    def write(ranks: Sequence[Iterable[pb.Node]], name: str = "trace") -> str:
        from chakra_core.testing import write_ranks

        return write_ranks(tmp_path, ranks, name)
    return write


@pytest.fixture
def chakra_host() -> Callable[..., PluginHost]:
    """Factory: `chakra_host(extra_plugins=[(name, plugin)])` -> a fresh plugin host."""
    from chakra_core.testing import testing_host

    return testing_host


@pytest.fixture
def chakra_run(tmp_path: Path) -> Callable[..., JsonObject]:
    """Factory: `chakra_run(manifest_mapping, extra_plugins=(), host=None)` -> results document."""
    def run(data: Mapping[str, JsonValue], extra_plugins: Iterable[tuple[str, Any]] = (),
            host: PluginHost | None = None) -> JsonObject:
        from chakra_core.testing import simulate

        return simulate(data, base_dir=tmp_path, extra_plugins=extra_plugins, host=host)
    return run


@pytest.fixture
def chakra_installed() -> Callable[[str, str], PluginHost]:
    """Factory: `chakra_installed("network", "analytical")` skips the test unless it is installed;
    returns the plugin host that has it."""
    from chakra_core.errors import PluginError
    from chakra_core.testing import testing_host

    host = testing_host()

    def need(layer: str, name: str) -> PluginHost:
        try:
            host.get(layer, name)
        except PluginError as exc:
            pytest.skip(str(exc))
        return host
    return need
