"""Observer hooks: an exception names its plugin, results are read-only, returns land under "plugins"."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest

from chakra_core.errors import PluginError
from chakra_core.contract.hookspecs import hookimpl
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from chakra_core.testing import collective, comp, manifest, simulate, uniform_network, write_ranks


def _two_ranks(tmp_path) -> dict:
    prefix = write_ranks(tmp_path / "t", [[comp(1, 2), collective(2, pb.ALL_REDUCE, 4096, deps=[1])]] * 2)
    return manifest(prefix, uniform_network(2))


class _Raises:
    def __init__(self, hook: str):
        self.hook = hook

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            raise ValueError("bad\nstatistic")

    @hookimpl
    def chakra_sim_simulation_start(self, run):
        self._maybe_raise("chakra_sim_simulation_start")

    @hookimpl
    def chakra_sim_node_finished(self, rank, node, start_ns, end_ns):
        self._maybe_raise("chakra_sim_node_finished")

    @hookimpl
    def chakra_sim_simulation_end(self, run, results):
        self._maybe_raise("chakra_sim_simulation_end")


@pytest.mark.parametrize("hook", ["chakra_sim_simulation_start", "chakra_sim_node_finished",
                                  "chakra_sim_simulation_end"])
def test_an_observer_that_raises_is_named_on_one_line(tmp_path, hook):
    with pytest.raises(PluginError) as info:
        simulate(_two_ranks(tmp_path), extra_plugins=[("stats", _Raises(hook))])
    message = str(info.value)
    assert message.startswith("plugin 'stats' (stats 0) raised ValueError: bad statistic in " + hook)
    assert "\n" not in message
    assert message.endswith(f"(tests.test_observers:{_Raises._maybe_raise.__code__.co_firstlineno + 2})")
    assert isinstance(info.value.__cause__, ValueError)


def test_a_node_observer_error_says_when(tmp_path):
    with pytest.raises(PluginError, match=r"in chakra_sim_node_finished at t=2000 ns"):
        simulate(_two_ranks(tmp_path), extra_plugins=[("stats", _Raises("chakra_sim_node_finished"))])


def test_only_the_plugin_that_raised_is_named(tmp_path):
    class Quiet:
        @hookimpl
        def chakra_sim_simulation_end(self, run, results):
            return {"ok": True}

    with pytest.raises(PluginError, match="^plugin 'loud' "):
        simulate(_two_ranks(tmp_path), extra_plugins=[("loud", _Raises("chakra_sim_simulation_end")),
                                                     ("quiet", Quiet())])


# The command line: exit status 2 and one line, for a plugin installed as a distribution ---------------
PLUGIN_SOURCE = """
    from chakra_core.contract.hookspecs import hookimpl
    from chakra_core.testing import UniformNetwork


    @hookimpl
    def chakra_sim_register_network(registry):
        registry.add(UniformNetwork)


    @hookimpl
    def chakra_sim_simulation_end(run, results):
        raise ValueError("no end in sight")
    """


def test_the_cli_reports_an_observer_error_in_one_line_with_exit_status_2(tmp_path):
    site = tmp_path / "site"
    (site / "boom_observer-1.0.dist-info").mkdir(parents=True)
    source = textwrap.dedent(PLUGIN_SOURCE)
    (site / "boom_observer.py").write_text(source)
    raise_line = source.splitlines().index('    raise ValueError("no end in sight")') + 1
    (site / "boom_observer-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: boom-observer\nVersion: 1.0\n")
    (site / "boom_observer-1.0.dist-info" / "entry_points.txt").write_text(
        "[chakra_sim]\nboom_obs = boom_observer\n")
    prefix = write_ranks(tmp_path / "t", [[comp(1, 1)]] * 2)
    (tmp_path / "m.yaml").write_text(json.dumps(
        {**manifest(prefix, uniform_network(2)), "output": {"dir": str(tmp_path / "out")}}))
    done = subprocess.run([sys.executable, "-m", "chakra_core.cli", "run", str(tmp_path / "m.yaml"), "--quiet"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(site), "PATH": "",
                                                                "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: plugin 'boom_obs' (boom-observer 1.0) raised ValueError: no end in sight "
        f"in chakra_sim_simulation_end (boom_observer:{raise_line})"]
    assert not (tmp_path / "out" / "results.json").exists()


# Read-only views and returned results ---------------------------------------------------------------
class _Meddler:
    """Tries to change the run and the results, then returns its own statistics."""

    def __init__(self):
        self.refused: list[str] = []
        self.copy_finish = None

    def _try(self, label: str, change) -> None:
        try:
            change()
        except TypeError:
            self.refused.append(label)

    @hookimpl
    def chakra_sim_simulation_start(self, run):
        self._try("manifest", lambda: run["manifest"].__setitem__("workload", {}))
        self._try("layers", lambda: run["layers"].pop("network"))

    @hookimpl
    def chakra_sim_simulation_end(self, run, results):
        self._try("finish_ns", lambda: results.__setitem__("finish_ns", 0))
        self._try("update", lambda: results.update(finish_ns=0))
        self._try("rank row", lambda: results["ranks"][0].__setitem__("finish_ns", 0))
        self._try("ranks list", lambda: results["ranks"].append({}))
        self._try("setdefault", lambda: results.setdefault("plugins", {}))
        dict.__setitem__(results, "finish_ns", -1)      # bypassing the checks changes only the copy
        mutable = copy.deepcopy(results)
        mutable["ranks"][0]["finish_ns"] = 0
        mutable["ranks"].append({})
        self.copy_finish = mutable["finish_ns"]
        return {"nodes": sum(sum(r["node_counts"].values()) for r in results["ranks"]),
                "serialised": len(json.dumps(results)) > 0}


def test_observers_cannot_change_the_run_or_the_results(tmp_path):
    meddler = _Meddler()
    plain = simulate(_two_ranks(tmp_path / "a"))
    results = simulate(_two_ranks(tmp_path / "b"), extra_plugins=[("meddler", meddler)])
    assert meddler.refused == ["manifest", "layers", "finish_ns", "update", "rank row", "ranks list",
                               "setdefault"]
    assert meddler.copy_finish == -1
    assert results["plugins"] == {"meddler": {"nodes": 4, "serialised": True}}
    del results["plugins"]
    assert json.dumps(results["ranks"]) == json.dumps(plain["ranks"])
    assert results["finish_ns"] == plain["finish_ns"] > 0
    assert results["manifest"]["workload"]["trace"].endswith("b/t/trace")


class _Returns:
    def __init__(self, value):
        self.value = value

    @hookimpl
    def chakra_sim_simulation_end(self, results):       # a subset of the hook's arguments is fine
        return self.value


def test_returns_are_stored_by_plugin_name_in_name_order(tmp_path):
    results = simulate(_two_ranks(tmp_path), extra_plugins=[
        ("zeta", _Returns({"b": (1, 2), 3: "int key"})), ("alpha", _Returns({"a": 1})), ("none", _Returns(None))])
    assert list(results["plugins"]) == ["alpha", "zeta"]
    assert results["plugins"]["zeta"] == {"b": [1, 2], "3": "int key"}     # as results.json holds it


@pytest.mark.parametrize("value, reason", [
    ([1, 2], "returned list from chakra_sim_simulation_end; return a JSON-serialisable dict or None"),
    ({"when": object()}, "returned a result from chakra_sim_simulation_end that is not JSON-serialisable"),
])
def test_a_bad_return_value_is_an_error_naming_the_plugin(tmp_path, value, reason):
    with pytest.raises(PluginError, match=r"^plugin 'bad' \(bad 0\) " + reason):
        simulate(_two_ranks(tmp_path), extra_plugins=[("bad", _Returns(value))])


def test_hook_wrappers_are_refused_for_observer_hooks():
    class Wrapper:
        @hookimpl(wrapper=True)
        def chakra_sim_simulation_end(self, run, results):
            return (yield)

    host = make_plugin_host(entry_points=[], extra_plugins=[("wrapping", Wrapper())])
    failed = {info.name: info.error for info in host.failed()}
    assert "chakra_sim_simulation_end is implemented as a hook wrapper" in failed["wrapping"]
    assert not host.has_observer("chakra_sim_simulation_end")
