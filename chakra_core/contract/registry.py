"""Typed registries handed to the `chakra_sim_register_<layer>` and `_commands` hooks.

One registry per layer, as tox 4 keeps one per kind of plugin: `add(cls)` checks
the class against its layer's interface and refuses a name already taken,
naming both providers. The system registry also takes collective algorithms
(`add_algorithm`), the command registry click commands a plugin adds to
`chakra-sim` (`add`), and the profile section registry the sections of a hardware
profile a plugin owns (`add`, chakra_core.contract.profile_sections).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, TypeVar

import click
from pydantic import BaseModel

from chakra_core.contract.algorithm import CollectiveAlgorithm
from chakra_core.contract.layers import (LAYERS, RESERVED_NAMES, ComputeModel, LayerModel, MemoryModel,
                                         SystemLayer)
from chakra_core.contract.network import ContentionFreeNetwork, NetworkModel
from chakra_core.contract.profile_sections import (CORE_KEYS, CORE_PARTS, M, ProfileSection, ProfileSections,
                                                   RateRules)
from chakra_core.errors import PluginError

L = TypeVar("L", bound=LayerModel)


class _Owned:
    """Who registered what: the plugin currently registering is `current_owner`."""

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.current_owner = "<unknown>"

    def _claim(self, key: str, kind: str) -> None:
        if key in self.owners:
            raise PluginError(f"{kind} is registered twice: by '{self.owners[key]}' and by "
                              f"'{self.current_owner}'")
        self.owners[key] = self.current_owner

    def forget(self, owner: str) -> None:
        """Undo everything `owner` registered (a plugin that failed half-way is not usable)."""
        for key in [k for k, who in self.owners.items() if who == owner]:
            del self.owners[key]
            self._drop(key)

    def _drop(self, key: str) -> None:
        raise NotImplementedError


class LayerRegistry(_Owned, Generic[L]):
    """Implementations of one layer, by the name a manifest selects them with."""

    layer: str
    base: type[LayerModel]

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, type[L]] = {}

    def add(self, cls: type[L]) -> type[L]:
        """Register an implementation class of this registry's layer; returns it."""
        owner = self.current_owner
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(f"plugin '{owner}' registered {cls!r} as a {self.layer} model, "
                              f"but it does not subclass chakra_core.{self.base.__name__}")
        for attr in ("name", "fidelity"):
            value = getattr(cls, attr, None)
            if not isinstance(value, str) or not value:
                raise PluginError(f"plugin '{owner}': {cls.__qualname__} needs a non-empty "
                                  f"string class attribute '{attr}'")
        config = getattr(cls, "Config", None)
        if not (isinstance(config, type) and issubclass(config, BaseModel)):
            raise PluginError(f"plugin '{owner}': {cls.__qualname__}.Config must be a pydantic model")
        if cls.name in RESERVED_NAMES:
            raise PluginError(f"plugin '{owner}': {cls.__qualname__}.name '{cls.name}' is a key of "
                              "chakra-sim's own results; choose another name")
        self._check(cls)
        self._claim(cls.name, f"{self.layer} model name '{cls.name}'")
        self.classes[cls.name] = cls
        return cls

    def _check(self, cls: type[L]) -> None:
        """Layer-specific checks of a class (nothing by default)."""

    def _drop(self, key: str) -> None:
        self.classes.pop(key, None)


class ComputeRegistry(LayerRegistry[ComputeModel]):
    layer, base = "compute", ComputeModel


class MemoryRegistry(LayerRegistry[MemoryModel]):
    layer, base = "memory", MemoryModel


class NetworkRegistry(LayerRegistry[NetworkModel]):
    layer, base = "network", NetworkModel

    def _check(self, cls: type[NetworkModel]) -> None:
        if cls.contention_free and not issubclass(cls, ContentionFreeNetwork):
            raise PluginError(f"plugin '{self.current_owner}': {cls.__qualname__} sets "
                              "contention_free but has no message_delay(src, dst, size)")


class SystemRegistry(LayerRegistry[SystemLayer]):
    """System layers, and the collective algorithms the built-in layer runs."""

    layer, base = "system", SystemLayer

    def __init__(self) -> None:
        super().__init__()
        self.algorithms: dict[str, type[CollectiveAlgorithm]] = {}

    def add_algorithm(self, cls: type[CollectiveAlgorithm]) -> type[CollectiveAlgorithm]:
        """Register a collective algorithm class (see chakra_core.contract.algorithm); returns it."""
        owner = self.current_owner
        if not (isinstance(cls, type) and issubclass(cls, CollectiveAlgorithm)):
            raise PluginError(f"plugin '{owner}': algorithm {cls!r} does not subclass "
                              "chakra_core.CollectiveAlgorithm")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin '{owner}': algorithm {cls!r} needs a 'name'")
        self._claim("algorithm:" + name, f"collective algorithm '{name}'")
        self.algorithms[name] = cls
        return cls

    def _drop(self, key: str) -> None:
        if key.startswith("algorithm:"):
            self.algorithms.pop(key.split(":", 1)[1], None)
        else:
            self.classes.pop(key, None)


class CommandRegistry(_Owned):
    """Commands plugins add to the `chakra-sim` command line."""

    def __init__(self, reserved: Iterable[str] = ()):
        super().__init__()
        self.commands: dict[str, click.Command] = {}
        self.reserved = frozenset(reserved)

    def add(self, command: click.Command) -> click.Command:
        """Add a click command (or group) under its own name; returns it."""
        owner = self.current_owner
        if not isinstance(command, click.Command) or not command.name:
            raise PluginError(f"plugin '{owner}' registered {command!r} as a command; give a named "
                              "click.Command (@click.command(\"name\"))")
        if command.name in self.reserved:
            raise PluginError(f"plugin '{owner}': command '{command.name}' is one of chakra-sim's own")
        self._claim("command:" + command.name, f"command '{command.name}'")
        self.commands[command.name] = command
        return command

    def owner(self, name: str) -> str:
        """The plugin that added command `name`."""
        return self.owners["command:" + name]

    def _drop(self, key: str) -> None:
        self.commands.pop(key.split(":", 1)[1], None)


class ProfileSectionRegistry(_Owned):
    """Sections of a hardware profile plugins own, by key path (`nccl`, `gpu.achievable`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, ProfileSection[Any]] = {}

    def add(self, key: str, schema: type[M], check: Callable[[M, Any], None] | None = None,
            rates: RateRules | None = None) -> type[M]:
        """Register `schema` (a pydantic model) for the profile key `key`; returns the schema.
        `check` and `rates`: see chakra_core.contract.profile_sections."""
        owner = self.current_owner
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise PluginError(f"plugin '{owner}': profile section '{key}' needs a pydantic model, not {schema!r}")
        # a name at the top, or one inside a part of the core profile (gpu.achievable)
        valid = isinstance(key, str) and re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?", key) is not None and (
            key.split(".")[0] in CORE_PARTS if "." in key else key not in CORE_KEYS)
        if not valid:
            raise PluginError(f"plugin '{owner}': profile section key {key!r} is not one a plugin may take: a "
                              f"lower-case name, at the top or inside one of {', '.join(CORE_PARTS)} "
                              f"(e.g. 'gpu.my_rates'), not a key of the core profile ({', '.join(sorted(CORE_KEYS))})")
        self._claim("section:" + key, f"profile section '{key}'")
        self.sections[key] = ProfileSection(key, schema, check, rates, owner)
        return schema

    def snapshot(self) -> ProfileSections:
        """The sections registered so far, in registration order, for the profile loader."""
        return ProfileSections(tuple(self.sections.values()))

    def _drop(self, key: str) -> None:
        self.sections.pop(key.split(":", 1)[1], None)


@dataclass
class Registries:
    """Every registry of one plugin host."""

    system: SystemRegistry = field(default_factory=SystemRegistry)
    compute: ComputeRegistry = field(default_factory=ComputeRegistry)
    memory: MemoryRegistry = field(default_factory=MemoryRegistry)
    network: NetworkRegistry = field(default_factory=NetworkRegistry)
    commands: CommandRegistry = field(default_factory=CommandRegistry)
    profile_sections: ProfileSectionRegistry = field(default_factory=ProfileSectionRegistry)

    def layer(self, name: str) -> LayerRegistry[Any]:
        """The registry of a layer by name ("system", "compute", "memory", "network")."""
        if name not in LAYERS:
            raise KeyError(name)
        registry: LayerRegistry[Any] = getattr(self, name)
        return registry

    def all(self) -> tuple[_Owned, ...]:
        return (self.system, self.compute, self.memory, self.network, self.commands, self.profile_sections)
