"""The chakra-sim plugin contract (pluggy project name ``chakra_sim``).

This file is the plugin author's manual. A plugin is a module (or object)
with functions named after the hooks below, decorated with
``chakra_core.hookimpl``, published through an entry point in the
``chakra_sim`` group of its own ``pyproject.toml``::

    [project.entry-points.chakra_sim]
    my_backend = "my_pkg.plugin"

After ``pip install`` of that distribution, ``chakra-sim plugins`` lists it and
a manifest selects it with ``plugin: <name>`` in the matching section.
Naming convention for bundled plugins: distribution ``chakra-sim-<name>``,
import package ``chakra_sim_<name>``, entry point ``<name>``.

Two kinds of hooks:

- **Registration hooks** (``chakra_sim_register_<layer>``,
  ``chakra_sim_register_profile_sections``) are called once, when plugins load.
  They add implementation *classes* (or profile section schemas) to a typed registry. They
  never run the simulation: the engine instantiates the selected class and
  calls its methods directly (a pluggy call costs ~4 µs, a method call ~0.2 µs).
  ``chakra_sim_register_commands`` adds click commands to ``chakra-sim``; it is
  called only when the command line needs them.
- **Observer hooks** (``chakra_sim_simulation_start``/``_end``,
  ``chakra_sim_node_finished``) let statistics and tracing plugins watch a run.
  The per-node hook is dispatched only if at least one plugin implements it,
  checked once per run, so it costs nothing otherwise. The engine calls each
  implementation itself (latest registered first, as pluggy would), so an
  exception it raises stops the run with a one-line ``PluginError`` naming the
  plugin and the hook (the CLI exits with status 2). Observers see read-only
  copies of the run and the results; ``chakra_sim_simulation_end`` *returns*
  what it wants stored. Hook wrappers (``hookwrapper=True``/``wrapper=True``)
  are refused for observer hooks: the plugin is reported as failed.

See docs/writing-a-plugin.md for a complete third-party example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import pluggy
from chakra_core.json_types import JsonObject

if TYPE_CHECKING:
    from chakra_core.contract.registry import (CommandRegistry, ComputeRegistry, MemoryRegistry,
                                               NetworkRegistry, ProfileSectionRegistry, SystemRegistry)
    from chakra_core.et.attrs import NodeView

PROJECT = "chakra_sim"
ENTRY_POINT_GROUP = "chakra_sim"
OBSERVER_HOOKS = ("chakra_sim_simulation_start", "chakra_sim_simulation_end", "chakra_sim_node_finished")
"""Hooks the engine calls during a run, one implementation at a time."""
LAYER_HOOKS = tuple(f"chakra_sim_register_{layer}" for layer in ("system", "compute", "memory", "network"))
"""Registration hooks called when plugins load."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def chakra_sim_register_compute(registry: "ComputeRegistry") -> None:
    """Register compute models (classes subclassing ``chakra_core.ComputeModel``).

    Called once per plugin when plugins load, before any manifest is read.

    :param registry: call ``registry.add(MyComputeModel)`` for each class. The
        class needs ``name`` (used after ``plugin:``), ``fidelity`` (one line)
        and ``Config`` (pydantic model of its manifest section). ``add`` raises
        ``PluginError`` if the name is already taken.
    """


@hookspec
def chakra_sim_register_memory(registry: "MemoryRegistry") -> None:
    """Register memory models (subclasses of ``chakra_core.MemoryModel``).

    Called once per plugin when plugins load.

    :param registry: ``registry.add(MyMemoryModel)``; same rules as for compute.
    """


@hookspec
def chakra_sim_register_network(registry: "NetworkRegistry") -> None:
    """Register network backends (subclasses of ``chakra_core.NetworkModel``).

    Called once per plugin when plugins load. A backend whose message delay
    never depends on other traffic sets ``contention_free = True`` and
    implements ``message_delay`` (``chakra_core.ContentionFreeNetwork``); the
    system layer then times collectives in closed form instead of message by
    message. ``chakra_core.ClosedFormNetwork`` is the other optional fast path.

    :param registry: ``registry.add(MyNetwork)``; same rules as for compute, and
        a class declaring ``contention_free = True`` must have ``message_delay``.
    """


@hookspec
def chakra_sim_register_system(registry: "SystemRegistry") -> None:
    """Register system layers and collective algorithms.

    Called once per plugin when plugins load. The built-in system layer
    (``native``) and its algorithms are registered through this same hook, so
    a third party can add an algorithm (``registry.add_algorithm(cls)``, a
    ``chakra_core.CollectiveAlgorithm``) or replace the whole layer
    (``registry.add(MySystemLayer)``).

    :param registry: the system registry; ``add`` as for compute,
        ``add_algorithm`` refuses a name already taken.
    """


@hookspec
def chakra_sim_register_profile_sections(registry: "ProfileSectionRegistry") -> None:
    """Register the sections of a hardware profile your models read (docs/hardware.md).

    Called once per plugin when plugins load, before any profile is read. The core profile
    holds the GPU, the node and the network; what only your model needs (NCCL's channels, a
    GPU's achievable rates) is a section you own: the loader validates it against your schema
    when it reads a profile, and your model reads it with ``profile.section(key, Schema)``
    (``None`` when the profile has none: say what is missing when your model needs it).

    :param registry: ``registry.add(key, Schema, check=None, rates=None)``. ``key`` is a
        lower-case name at the top of the profile (``nccl``) or inside one of ``gpu``, ``node``,
        ``network`` (``gpu.achievable``); ``Schema`` a pydantic model (subclass
        ``chakra_core.contract.ProfileSectionModel``: unknown keys are errors). ``check(section,
        profile)`` raises ``ValueError`` where the section contradicts the core profile (reported
        at the section's key); ``rates(raw)`` names the rates that hold only for the core values
        they were measured with (chakra_core.contract.profile_sections). A key taken by another
        plugin is refused (``PluginError``) and the plugin listed as failed.
    """


@hookspec
def chakra_sim_register_commands(registry: "CommandRegistry") -> None:
    """Add commands to the ``chakra-sim`` command line.

    Called once per plugin, and only when the command line lists or looks up a
    command that is not one of chakra-sim's own (``chakra-sim --help``, or an
    unknown name), so a run never pays for it. Import the command's module
    inside the hook to keep plugin loading cheap.

    :param registry: ``registry.add(command)`` with a named ``click.Command`` (or
        group); a name chakra-sim uses or another plugin took is refused
        (``PluginError``), and the plugin is listed as failed.
    """


@hookspec
def chakra_sim_simulation_start(run: Mapping[str, Any]) -> None:
    """Called once, after the layers are built and the traces opened, before the first event.

    :param run: ``{"manifest": <resolved manifest>, "num_ranks": int,
        "layers": {layer: instance}, "version": <chakra-sim version>}``, read-only:
        a ``chakra_core.engine.observers.ReadOnlyDict`` (a dict subclass whose
        changes raise ``TypeError``; nested dicts and lists are read-only too).
        The layer instances are the live ones: read their attributes, do not
        drive them.
    """


@hookspec
def chakra_sim_simulation_end(run: Mapping[str, Any], results: Mapping[str, Any]) -> JsonObject | None:
    """Called once when the run ends successfully, before results are written.

    Not called when the run fails (an error, a deadlock). Observers are called
    latest registered first; each sees the same document, without the others'
    returns.

    :param run: the same mapping as for ``chakra_sim_simulation_start``.
    :param results: a read-only copy of the results document (what
        ``results.json`` will hold): ``results["finish_ns"] = 0`` or
        ``results["ranks"][0].update(...)`` raise ``TypeError``, and since it is a
        copy nothing you do to it reaches the engine's document.
        ``json.dumps(results)`` works; ``copy.deepcopy(results)`` gives plain,
        mutable dicts and lists.
    :return: a JSON-serialisable dict, stored (after a JSON round trip, so
        tuples become lists and keys strings) as
        ``results["plugins"][<plugin name>]``, the plugin name being the entry
        point's name; or ``None`` to add nothing. ``results["plugins"]`` holds
        one key per observer that returned a dict, in name order, and is absent
        when none did. Any other return value stops the run with a
        ``PluginError`` naming the plugin.
    """


@hookspec
def chakra_sim_node_finished(rank: int, node: "NodeView", start_ns: int, end_ns: int) -> None:
    """Called when any node finishes on any rank (only if some plugin implements it).

    Implementing this hook slows a run down (one call per node); use it for
    tracing and statistics plugins, not in models. The return value is ignored.

    :param rank: the rank the node belongs to.
    :param node: the finished node (read-only view).
    :param start_ns: simulated time the node was issued.
    :param end_ns: simulated time it finished.
    """
