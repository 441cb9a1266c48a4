"""Plugin discovery, registration and lookup.

Entry points in the ``chakra_sim`` group are loaded one at a time. A plugin
that fails to import, or whose hook implementations do not match the
hookspecs, is recorded with its error and reported by ``chakra-sim plugins``;
it fails a run only if the manifest selects something only it could provide.
(pluggy's ``load_setuptools_entrypoints`` would abort on the first failure.)

Built-in implementations (the ``native`` system layer, the ``replay`` compute
model) are registered through the same hooks as third-party plugins, first;
entry points follow in name order, so when two plugins register the same
name the later one is reported as failed (deterministically).

Use ``make_plugin_host()`` for a fresh host; tests build their own with fake
entry points or in-process plugins instead of sharing a module global.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import click
import pluggy

from chakra_core.contract import hookspecs
from chakra_core.contract.algorithm import CollectiveAlgorithm
from chakra_core.contract.layers import LAYERS, LayerModel
from chakra_core.contract.profile_sections import ProfileSections
from chakra_core.contract.registry import LayerRegistry, Registries
from chakra_core.errors import PluginError
from chakra_core.json_types import JsonObject

BUILTIN_NAME = "chakra-sim (built-in)"


@dataclass
class PluginInfo:
    """One loaded (or failed) plugin."""

    name: str                 # entry-point name, or BUILTIN_NAME
    distribution: str
    version: str
    status: str = "ok"        # "ok" or "failed"
    error: str = ""
    modules: tuple[str, ...] = ()


@dataclass
class Implementation:
    """A class registered for a layer, with the plugin that provided it."""

    layer: str
    name: str
    cls: type[LayerModel]
    plugin: PluginInfo

    @property
    def fidelity(self) -> str:
        return self.cls.fidelity


@dataclass(frozen=True)
class PluginRow:
    """One row of `chakra-sim plugins`: an implementation, a command a plugin adds, or a plugin
    that failed to load (status FAILED, with its error)."""

    layer: str
    name: str
    plugin: str
    distribution: str
    version: str
    fidelity: str
    status: str = "ok"
    error: str | None = None
    config_schema: JsonObject | None = None

    def to_json(self) -> JsonObject:
        row: JsonObject = {"layer": self.layer, "name": self.name, "plugin": self.plugin,
                           "distribution": self.distribution, "version": self.version,
                           "fidelity": self.fidelity, "status": self.status}
        if self.error is not None:
            row["error"] = self.error
        row["config_schema"] = self.config_schema
        return row


@dataclass
class PluginHost:
    """Loaded plugins, their registries, and the pluggy manager for observer hooks."""

    pm: pluggy.PluginManager
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    registries: Registries = field(default_factory=Registries)
    _commands_loaded: bool = False

    # Lookup ---------------------------------------------------------------------------
    def implementations(self, layer: str) -> list[Implementation]:
        registry = self.registries.layer(layer)
        return [Implementation(layer, name, cls, self.plugins[registry.owners[name]])
                for name, cls in sorted(registry.classes.items())]

    def failed(self) -> list[PluginInfo]:
        return [info for info in self.plugins.values() if info.status != "ok"]

    def get(self, layer: str, name: str) -> Implementation:
        """The implementation a manifest selects, or a PluginError that says what is installed."""
        if layer not in LAYERS:
            raise PluginError(f"unknown layer '{layer}'; layers are {', '.join(LAYERS)}")
        for impl in self.implementations(layer):
            if impl.name == name:
                return impl
        installed = ", ".join(i.name for i in self.implementations(layer)) or "none"
        message = f"no {layer} plugin named '{name}'; installed {layer} plugins: {installed}"
        failed = self.failed()
        if failed:
            message += ". These plugins failed to load and may provide it: " + "; ".join(
                f"'{f.name}' ({f.distribution} {f.version}): {f.error}" for f in failed)
        else:
            message += " (see `chakra-sim plugins`)"
        raise PluginError(message)

    def algorithms(self) -> dict[str, type[CollectiveAlgorithm]]:
        """The collective algorithms registered with the system registry, by name."""
        return dict(self.registries.system.algorithms)

    def profile_sections(self) -> ProfileSections:
        """The profile sections the plugins registered (load_profile's `sections`)."""
        return self.registries.profile_sections.snapshot()

    def astra_equivalents(self, layer: str, model: str) -> list[Implementation]:
        """The implementations of `layer` that stand for ASTRA-sim's `model` (see AstraEquivalent)."""
        return [impl for impl in self.implementations(layer)
                if impl.cls.astra_sim is not None and impl.cls.astra_sim.model == model]

    def commands(self, reserved: frozenset[str] = frozenset()) -> dict[str, click.Command]:
        """Commands plugins add to `chakra-sim` (their `chakra_sim_register_commands` hooks run on
        the first call); a plugin whose hook fails is marked failed and adds none."""
        registry = self.registries.commands
        if not self._commands_loaded:
            self._commands_loaded = True
            registry.reserved = frozenset(reserved)
            for impl in self.pm.hook.chakra_sim_register_commands.get_hookimpls():
                info = self.plugins.get(impl.plugin_name)
                registry.current_owner = impl.plugin_name
                try:
                    impl.function(registry)
                except Exception as exc:
                    registry.forget(impl.plugin_name)
                    if info is not None:
                        info.status, info.error = "failed", f"error while registering commands: {_detail(exc)}"
        return dict(sorted(registry.commands.items()))

    def owner_of_module(self, module_name: str) -> PluginInfo | None:
        """The plugin whose code lives in `module_name` (for naming a plugin that raised)."""
        for info in self.plugins.values():
            for prefix in info.modules:
                if module_name == prefix or module_name.startswith(prefix + "."):
                    return info
        return None

    def has_observer(self, hook_name: str) -> bool:
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())

    # Listing --------------------------------------------------------------------------
    def listing(self, include_builtins: bool = True,
                reserved_commands: frozenset[str] | None = None) -> list[PluginRow]:
        """Rows for `chakra-sim plugins`: one per implementation, one per command plugins add (when
        `reserved_commands`, chakra-sim's own, is given), then one per failed plugin."""
        commands = self.commands(reserved_commands) if reserved_commands is not None else {}
        rows: list[PluginRow] = []
        for layer in LAYERS:
            for impl in self.implementations(layer):
                if not include_builtins and impl.plugin.name == BUILTIN_NAME:
                    continue
                rows.append(PluginRow(layer, impl.name, impl.plugin.name, impl.plugin.distribution,
                                      impl.plugin.version, impl.fidelity,
                                      config_schema=impl.cls.Config.model_json_schema()))
        for name, command in commands.items():   # registered first: a plugin may fail doing so
            info = self.plugins[self.registries.commands.owner(name)]
            rows.append(PluginRow("command", name, info.name, info.distribution, info.version,
                                  command.get_short_help_str(80)))
        for info in self.failed():
            rows.append(PluginRow("?", info.name, info.name, info.distribution, info.version, "", "FAILED",
                                  info.error))
        return rows


def _detail(exc: Exception) -> str:
    """What a plugin's failure to register says: our own message, or the exception's type and text."""
    return str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"


def _module_names(obj: Any) -> tuple[str, ...]:
    name = getattr(obj, "__name__", None) if isinstance(obj, type(sys)) else type(obj).__module__
    if not name:
        return ()
    return (name.split(".")[0],)


def _check_observers(pm: pluggy.PluginManager, obj: Any) -> None:
    """The engine calls observer implementations one by one (to name a plugin that raises), so it
    cannot run pluggy's hook wrappers; refuse them at load time rather than skip them silently."""
    for hook_name in hookspecs.OBSERVER_HOOKS:
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.plugin is obj and (impl.hookwrapper or impl.wrapper):
                raise PluginError(f"{hook_name} is implemented as a hook wrapper; observer hooks "
                                  "take plain implementations")


def _register_plugin(host: PluginHost, obj: Any, info: PluginInfo) -> None:
    """Register one plugin object with pluggy and collect the classes it registers."""
    pm = host.pm
    try:
        pm.register(obj, name=info.name)
        pm.check_pending()
        _check_observers(pm, obj)
    except Exception as exc:  # pluggy.PluginValidationError and friends
        if pm.is_registered(obj):
            pm.unregister(obj)
        info.status, info.error = "failed", f"{type(exc).__name__}: {exc}"
        host.plugins[info.name] = info
        return
    host.plugins[info.name] = info
    try:
        for layer in LAYERS:
            hook = getattr(pm.hook, f"chakra_sim_register_{layer}")
            registry: LayerRegistry[LayerModel] = host.registries.layer(layer)
            for impl in hook.get_hookimpls():
                if impl.plugin is obj:
                    registry.current_owner = info.name
                    impl.function(registry)
        sections = host.registries.profile_sections
        for impl in pm.hook.chakra_sim_register_profile_sections.get_hookimpls():
            if impl.plugin is obj:
                sections.current_owner = info.name
                impl.function(sections)
    except Exception as exc:
        # Undo what the plugin registered: a half-registered plugin is not usable.
        for owned in host.registries.all():
            owned.forget(info.name)
        pm.unregister(obj)
        info.status, info.error = "failed", f"error while registering: {_detail(exc)}"


@lru_cache(maxsize=1)
def installed_profile_sections() -> ProfileSections:
    """The profile sections of the installed plugins (what `load_profile` validates a profile
    against unless told otherwise), their plugins discovered once per process."""
    return make_plugin_host().profile_sections()


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)


def make_plugin_host(entry_points: Iterable[metadata.EntryPoint] | None = None,
                     extra_plugins: Iterable[tuple[str, Any]] = (),
                     include_builtins: bool = True) -> PluginHost:
    """A fresh plugin host: built-ins, then installed entry points, then `extra_plugins`.

    `entry_points` replaces discovery (tests pass fakes); `extra_plugins` are
    (name, object) pairs registered in-process. An extra plugin already loaded from its entry
    point (a test registering its own installed module) is not registered twice.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm=pm)
    if include_builtins:
        from chakra_core import builtins as builtin_plugin
        from chakra_core._version import __version__
        _register_plugin(host, builtin_plugin,
                         PluginInfo(BUILTIN_NAME, "chakra-sim", __version__, modules=("chakra_core",)))
    for ep in sorted(entry_points if entry_points is not None else _entry_points(), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, dist.name if dist else "?", dist.version if dist else "?")
        if ep.name in host.plugins:
            info.status, info.error = "failed", f"entry point name '{ep.name}' is used twice"
            host.plugins[f"{ep.name} ({info.distribution})"] = info
            continue
        try:
            obj = ep.load()
        except Exception as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
            info.status, info.error = "failed", f"{type(exc).__name__}: {exc}{where}"
            host.plugins[ep.name] = info
            continue
        info.modules = _module_names(obj) or (ep.value.split(":")[0].split(".")[0],)
        _register_plugin(host, obj, info)
    for name, obj in extra_plugins:
        if pm.is_registered(obj):
            continue
        _register_plugin(host, obj, PluginInfo(name, name, "0", modules=_module_names(obj)))
    return host
