"""Observer hooks and blame: calling plugins one by one so that an error names the plugin.

Observer hooks (`chakra_sim_simulation_start` / `_end`, `chakra_sim_node_finished`)
are called here one implementation at a time, not through pluggy's dispatch, so
that an exception names the plugin that raised it. They receive read-only copies
(`ReadOnlyDict`); what a `chakra_sim_simulation_end` returns is stored under
`results["plugins"]`. `blame` turns any other exception raised during a run into
an error naming the plugin whose code raised it.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Callable, Iterable, Mapping

from chakra_core.plugins import PluginHost
from chakra_core.errors import ChakraSimError, PluginError, SimulationError
from chakra_core.json_types import JsonObject

ObserverCall = tuple[str, Callable[..., Any], tuple[str, ...]]
"""(plugin name, function, argument names) of one hook implementation."""


class Observers:
    """The observer hook implementations of a plugin host, called one by one."""

    def __init__(self, host: PluginHost, now: Callable[[], int]):
        self.host = host
        self.now = now
        """The simulated time, for error messages."""
        self.node_calls = self.calls("chakra_sim_node_finished")

    def calls(self, hook_name: str) -> list[ObserverCall]:
        """(plugin name, function, argument names) per implementation, in pluggy's order (last
        registered first). An implementation may take a subset of the hook's arguments."""
        hook = getattr(self.host.pm.hook, hook_name)
        return [(impl.plugin_name, impl.function, tuple(impl.argnames))
                for impl in reversed(hook.get_hookimpls())]

    def node_observer(self) -> Callable[..., None] | None:
        """What the drivers call per finished node, or None when nobody observes nodes."""
        calls = self.node_calls
        if not calls:
            return None

        def observe(**kwargs: Any) -> None:
            self.call("chakra_sim_node_finished", calls, kwargs)
        return observe

    def call(self, hook_name: str, calls: list[ObserverCall], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """Call each implementation; return (plugin name, returned value) pairs."""
        out = []
        for plugin, function, argnames in calls:
            try:
                value = function(*[kwargs[name] for name in argnames])
            except ChakraSimError:
                raise
            except Exception as exc:
                raise self.error(plugin, hook_name, exc) from exc
            out.append((plugin, value))
        return out

    def start(self, run_info: Mapping[str, Any]) -> None:
        hook = "chakra_sim_simulation_start"
        self.call(hook, self.calls(hook), {"run": run_info})

    def end(self, run_info: Mapping[str, Any], results: Mapping[str, Any]) -> JsonObject | None:
        """Call chakra_sim_simulation_end with a read-only copy of the results document; what the
        plugins returned, by plugin name (results.json's "plugins"), or None when none returned a dict."""
        hook_name = "chakra_sim_simulation_end"
        calls = self.calls(hook_name)
        if not calls:
            return None
        view = ReadOnlyDict.of(results)
        returned: JsonObject = {}
        for plugin, value in self.call(hook_name, calls, {"run": run_info, "results": view}):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise PluginError(f"{self.label(plugin)} returned {type(value).__name__} from "
                                  f"{hook_name}; return a JSON-serialisable dict or None")
            try:   # a JSON round trip: the stored value is exactly what results.json will hold
                returned[plugin] = json.loads(json.dumps(value))
            except (TypeError, ValueError) as exc:
                raise PluginError(f"{self.label(plugin)} returned a result from {hook_name} "
                                  f"that is not JSON-serialisable: {exc}") from exc
        return dict(sorted(returned.items())) if returned else None

    def label(self, plugin: str) -> str:
        info = self.host.plugins.get(plugin)
        return f"plugin '{plugin}'" + (f" ({info.distribution} {info.version})" if info is not None else "")

    def error(self, plugin: str, hook_name: str, exc: Exception) -> PluginError:
        """One line naming the plugin, the hook and the innermost line of the plugin's code."""
        info = self.host.plugins.get(plugin)
        prefixes = info.modules if info is not None else ()
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                where = f" ({module}:{tb.tb_lineno})"
            tb = tb.tb_next
        when = f" at t={self.now()} ns" if hook_name == "chakra_sim_node_finished" else ""
        detail = re.sub(r"\s*\n\s*", " ", str(exc)).strip()
        return PluginError(f"{self.label(plugin)} raised {type(exc).__name__}: {detail} "
                           f"in {hook_name}{when}{where}")


def blame(host: PluginHost, exc: BaseException, now: int) -> ChakraSimError:
    """Name the plugin whose code raised `exc` (innermost plugin frame wins)."""
    tb = exc.__traceback__
    culprit = None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        info = host.owner_of_module(module)
        if info is not None and info.distribution != "chakra-sim":
            culprit = (info, module, tb.tb_lineno)
        tb = tb.tb_next
    if culprit is None:
        return SimulationError(f"internal error at t={now} ns: "
                               f"{type(exc).__name__}: {exc} (please report this)")
    info, module, line = culprit
    return PluginError(f"plugin '{info.name}' ({info.distribution} {info.version}) raised "
                       f"{type(exc).__name__}: {exc} at t={now} ns ({module}:{line})")


class ReadOnlyDict(dict[Any, Any]):
    """A dict whose changes raise TypeError; observer hooks receive the run and the results so.

    `ReadOnlyDict.of(value)` copies dicts and lists recursively (lists become `ReadOnlyList`),
    so even a write that bypasses the checks leaves the engine's own document untouched. Other
    objects (the layer instances in `run["layers"]`) are shared, not copied. json.dumps works on
    it; copy.deepcopy returns plain, mutable dicts and lists.
    """

    @classmethod
    def of(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return cls((key, cls.of(item)) for key, item in value.items())
        if isinstance(value, list):
            return ReadOnlyList(cls.of(item) for item in value)
        if isinstance(value, tuple):
            return tuple(cls.of(item) for item in value)
        return value

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("read-only: observer hooks get copies they cannot change; "
                        "chakra_sim_simulation_end returns what it wants stored in the results "
                        "(copy.deepcopy() gives a mutable copy)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return {key: copy.deepcopy(item, memo) for key, item in self.items()}

    def __reduce_ex__(self, protocol: Any) -> Any:
        return dict, (dict(self),)


class ReadOnlyList(list[Any]):
    """The list counterpart of `ReadOnlyDict`."""

    def __init__(self, items: Iterable[Any] = ()):
        super().__init__(items)

    _refuse = ReadOnlyDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = \
        clear = sort = reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(item, memo) for item in self]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return list, (list(self),)
