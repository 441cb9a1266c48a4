"""A click group that imports its commands when used, and offers the commands plugins add."""

from __future__ import annotations

import importlib
from typing import Any

import click


class LazyGroup(click.Group):
    """A command group whose listed subcommands are imported only when used, and which also offers
    the commands installed plugins register (`plugin_commands=True`)."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, plugin_commands: bool = False,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}
        self.plugin_commands = plugin_commands
        self._plugins: dict[str, click.Command] | None = None

    def _own(self) -> frozenset[str]:
        return frozenset(self.commands) | frozenset(self.lazy)

    def _plugin_commands(self) -> dict[str, click.Command]:
        if self._plugins is None:
            self._plugins = {}
            if self.plugin_commands:
                from chakra_core.plugins import make_plugin_host

                self._plugins = make_plugin_host().commands(reserved=self._own())
        return self._plugins

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._own() | set(self._plugin_commands()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attribute = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name not in self._own():
            command = self._plugin_commands().get(cmd_name)
        return command
