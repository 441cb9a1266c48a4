"""The network interface: what every network provides, and two optional fast paths.

Every network backend subclasses `NetworkModel` and provides `npus_count`, `dims`
and `send`: enough for any system layer to move every message event by event.

Three optional protocols let the built-in system layer time collectives without an
event per message; a backend implements one when its physics allow it:

- `ContentionFreeNetwork` (`message_delay`): a message's delay depends only on
  (src, dst, size), never on other traffic. With `contention_free = True` the
  system layer times whole collective phases in closed form from it.
- `ClosedFormNetwork` (`claim`, `transfer`, ...): links are shared, but traffic
  whose links carry nothing else can still be timed without events; the network
  says which by accepting a `claim`, and asks for a restart if it was wrong
  (`LayerContext.request_restart`).
- `FlowNetwork` (`claim_flows`, `transfer_flows`, ...): a flow-level network
  times each step of a collective (a ring step, an all-to-all round) as one set
  of flows that start together and share the links among themselves, on links
  it has reserved for the collective as a whole.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence, runtime_checkable

from chakra_core.contract.layers import LayerModel


@dataclass(frozen=True)
class Dimension:
    """One dimension of a multi-dimensional network (ASTRA-sim network YAML semantics)."""

    topology: str        # "Ring", "FullyConnected" or "Switch"
    npus: int
    bandwidth_gbps: float  # GB/s with GB = 2^30 bytes
    latency_ns: float


class NetworkModel(LayerModel):
    """Moves messages between NPUs (required of every network backend)."""

    layer = "network"

    contention_free: bool = False
    """True when a message's delay depends only on (src, dst, size), never on other traffic; the
    network then implements `ContentionFreeNetwork.message_delay`. A class attribute an instance
    may override in `__init__` (read once, when the system layer is built)."""

    npus_count: int
    """Number of NPUs; must equal the number of ranks."""
    dims: tuple[Dimension, ...]
    """One entry per network dimension; the `npus` multiply to `npus_count`."""

    @abstractmethod
    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        """Inject `size` bytes from `src` to `dst` now; call `on_arrival(arg)` when they arrive."""

    def dim_of(self, src: int, dst: int) -> int:
        """The dimension a src -> dst message travels in: the first where their coordinates differ.

        Coordinates as ASTRA-sim numbers NPUs: dimension 0 varies fastest.
        """
        stride = 1
        for index, dim in enumerate(self.dims):
            if (src // stride) % dim.npus != (dst // stride) % dim.npus:
                return index
            stride *= dim.npus
        raise ValueError(f"src and dst are the same NPU ({src})")


@runtime_checkable
class ContentionFreeNetwork(Protocol):
    """Optional: the delay of one message on an idle network."""

    def message_delay(self, src: int, dst: int, size: int) -> int:
        """Delay of one `size`-byte message from `src` to `dst` on an idle network: exactly what
        `send` takes when nothing else is in flight (always, when `contention_free`)."""
        ...


@runtime_checkable
class ClosedFormNetwork(Protocol):
    """Optional: time traffic whose links carry nothing else without events.

    The system layer `claim`s the (src, dst) pairs of a collective; when the network can promise
    that nothing else will share their links, it times the messages with `transfer` /
    `transfer_uniform` when asked, in the order each sender sends them. Traffic the network did
    not expect on claimed links makes it call `context.request_restart` with a hint it reads
    back from `inputs.restart_hints` in the next attempt.
    """

    closed_form: bool
    """True (per instance) when the network offers this protocol in this run."""

    def message_delay(self, src: int, dst: int, size: int) -> int:
        """As `ContentionFreeNetwork.message_delay`: the delay on idle links."""
        ...

    def claim(self, pairs: Iterable[tuple[int, int]]) -> object | None:
        """Reserve the links of these pairs for closed-form messages: a token for `release`, or
        None (nothing reserved) when some of them may carry other traffic."""
        ...

    def release(self, token: object) -> None:
        """Every message of a claim has been timed."""
        ...

    def transfer(self, src: int, dst: int, size: int, send_time: int) -> int:
        """Arrival time of a claimed message sent at `send_time` (>= now), as the network would
        deliver it; the links' state and statistics change as its hops would change them."""
        ...

    def transfer_uniform(self, pairs: Sequence[tuple[int, int]], step_bytes: Sequence[int],
                         send_times: Sequence[int]) -> bool:
        """Every pair sends step k's message of step_bytes[k] at send_times[k]. If none of them
        can wait anywhere (each arrives in `message_delay`), record them all and return True;
        else change nothing and return False."""
        ...

    def checkpoint(self) -> None:
        """Start remembering what closed-form transfers change, for `rollback`."""
        ...

    def rollback(self) -> None:
        """Undo every closed-form transfer since `checkpoint`."""
        ...

    def commit(self) -> None:
        """Keep them (stop remembering)."""
        ...


@runtime_checkable
class FlowNetwork(Protocol):
    """Optional: time a collective's steps as sets of flows on links reserved for it.

    The system layer `claim_flows` a collective's runs, each as (members, offsets): the member
    at position i sends to position (i + o) % n for each offset o. When the network can promise
    that nothing else will use their links while the collective runs, it returns a token, and
    the system layer times each step with `transfer_flows`; traffic it did not expect on those
    links makes it request a restart, as a `ClosedFormNetwork` does. `release`, `checkpoint`,
    `rollback` and `commit` are `ClosedFormNetwork`'s.
    """

    flow_level: bool
    """True (per instance) when the network offers this protocol in this run. A network may also
    set `flow_exact` True: it then gets only steps that time the members exactly
    (`StepSchedule.exact`), as a network timing messages to the ns needs."""

    def claim_flows(self, runs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> object | None:
        """Reserve the links of every (members, offsets) run's flows for one collective: a token
        for `release`, or None (nothing reserved) when some may carry other traffic."""
        ...

    def transfer_flows(self, members: Sequence[int], offsets: Sequence[int], size: int,
                       send_times: Sequence[int]) -> list[int]:
        """One step of a claimed run: the member at position i sends `size` bytes to each position
        (i + o) % n at send_times[i]. Returns, per position, the later of its own send time and
        the arrival of the last flow into it; links' state and statistics change as the flows
        would change them."""
        ...

    def release(self, token: object) -> None: ...

    def checkpoint(self) -> None: ...

    def rollback(self) -> None: ...

    def commit(self) -> None: ...
