"""Errors chakra-sim reports to users.

Every error a user can cause carries enough context to fix the input without a
debugger: the file, the byte offset or key path, the node id, the plugin name.
The CLI prints `str(error)` and exits non-zero; no traceback for these.
"""

from __future__ import annotations


class ChakraSimError(Exception):
    """Base class of the errors caused by inputs (traces, manifests, plugins)."""


class TraceFormatError(ChakraSimError):
    """A .et file is truncated or not a Chakra protobuf stream."""

    def __init__(self, path: str, offset: int, reason: str):
        self.path, self.offset, self.reason = str(path), offset, reason
        super().__init__(f"{path}: at byte {offset}: {reason}")

    def __reduce__(self) -> tuple[type["TraceFormatError"], tuple[str, int, str]]:
        # raised in worker processes too (chakra_core.engine.folding)
        return type(self), (self.path, self.offset, self.reason)


class InputFileError(ChakraSimError):
    """An input file cannot be read: missing, not a regular file, too large, not text."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self) -> tuple[type["InputFileError"], tuple[str, str]]:
        return type(self), (self.path, self.reason)


class TraceGraphError(ChakraSimError):
    """The dependency graph of a trace is unusable (missing parent, cycle, duplicate id)."""


class AttributeTypeError(ChakraSimError):
    """A node attribute holds a value of a type the reader cannot use."""


class ManifestError(ChakraSimError):
    """A manifest (or an ASTRA-sim configuration file) is invalid.

    `problems` lists (location, reason) pairs, location being `file: key.path[i]`.
    """

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"  {loc}: {reason}" for loc, reason in problems]
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"invalid configuration ({len(problems)} {noun}):\n" + "\n".join(lines))


class PluginError(ChakraSimError):
    """A plugin is unknown, failed to load, or raised; the message names it."""


class SimulationError(ChakraSimError):
    """The simulation cannot proceed (mismatched collectives, a model returned nonsense)."""


class DeadlockError(SimulationError):
    """The event queue drained while ranks still hold unfinished nodes.

    `waits` maps rank -> list of human-readable descriptions of what it waits for.
    """

    def __init__(self, time_ns: int, waits: dict[int, list[str]], unfinished: dict[int, int]):
        self.time_ns, self.waits, self.unfinished = time_ns, waits, unfinished
        lines = [f"deadlock at t={time_ns} ns: {len(unfinished)} rank(s) cannot finish"]
        for rank in sorted(unfinished):
            lines.append(f"  rank {rank}: {unfinished[rank]} unfinished node(s)")
            for what in waits.get(rank, []):
                lines.append(f"    - {what}")
        super().__init__("\n".join(lines))
