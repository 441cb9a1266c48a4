"""Memory loads and stores (local HBM or ASTRA-sim's remote memory) and tensor capacity.

Timing. A MEM_LOAD_NODE / MEM_STORE_NODE of `tensor_size` bytes waits its fixed
latency, then transfers its bytes:

- local HBM: the rank's HBM bandwidth is shared by the rank's transfers in
  progress (processor sharing over `channels`, see `sharing.py`); a lone access
  takes int(latency_ns + size / bandwidth_gbps) ns;
- remote memory, `pool_sharing: fifo` (default): ASTRA-sim's AnalyticalRemoteMemory,
  remote-mem-latency + int(size / (remote-mem-bw x 1e9) x 1e9) ns in ASTRA-sim's
  float arithmetic; a per-NPU expansion serves every access at once, a per-node
  expansion and the pool serve one access at a time, first come first served;
- remote memory, `pool_sharing: fair`: the per-NPU / per-node / pool bandwidth is
  shared by its transfers in progress like local HBM (exact arithmetic).

Capacity. With `track_tensors` (default) the model follows the storages behind the
tensors in every node's IOInfo (see `tensors.py`) and reports each rank's peak,
a bounded bytes-in-use series, and out-of-memory against `capacity_gib`.

Folding. Local HBM and a per-NPU expansion keep only per-rank state (a rank's bandwidths, its
tensors), so a run with `NO_MEMORY_EXPANSION` or `PER_NPU_MEMORY_EXPANSION` may simulate one rank
per class of equivalent ranks (`fold_safe`); its run totals then count each simulated rank once
per rank it stands for. A per-node expansion and the pool simulate every rank: they are shared
by ranks that trace equivalence knows nothing about. The same models fold in time (time_fold.py).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

from chakra_core import AstraEquivalent, AttributeTypeError, LayerContext, MemoryModel, NodeView, SimulationError, pb
from chakra_core import JsonObject
from chakra_sim_memory_hbm.config import GIB, LOCATION_ATTR, NO_EXPANSION, PER_NODE, PER_NPU, POOL, HBMConfig
from chakra_sim_memory_hbm.sharing import SharedBandwidth, exact
from chakra_sim_memory_hbm.tensors import RankTensors, TensorTracker
from chakra_sim_memory_hbm.time_fold import SeriesLog, TimeFolded

class _Access:
    """A memory node going through a shared bandwidth (latency, then its transfer)."""

    __slots__ = ("node_id", "done", "link", "size", "issued", "latency_frac", "alone_ns", "remote", "weight")

    def __init__(self, node_id: int, done: Callable[[int], None], link: SharedBandwidth, size: int,
                 issued: int, latency_frac: Fraction, alone_ns: int, remote: bool, weight: int = 1) -> None:
        self.node_id, self.done, self.link, self.size = node_id, done, link, size
        self.issued, self.latency_frac, self.alone_ns, self.remote = issued, latency_frac, alone_ns, remote
        self.weight = weight        # ranks the issuing rank stands for (1 unless folded)


class HBMMemory(TimeFolded, MemoryModel):
    name = "hbm"
    fidelity = ("latency + size/bandwidth per access; concurrent accesses share a rank's HBM bandwidth "
                "(processor sharing over channels); ASTRA-sim remote memory (per-NPU, per-node/pool FIFO) "
                "or fair-shared; peak memory and OOM from IOInfo storage lifetimes; no caches, banks, "
                "fragmentation or allocator block caching")
    Config = HBMConfig
    # ASTRA-sim's remote memory (--astra-memory); a system file's local-mem-bw is the HBM bandwidth.
    astra_sim = AstraEquivalent("remote-memory", {"local-mem-bw": "bandwidth_gbps"})

    config: HBMConfig
    time_fold_safe = True      # per instance as fold_safe: shared remote memory is not (TimeFolded)

    def __init__(self, config: HBMConfig, context: LayerContext) -> None:
        super().__init__(config, context)
        # Local HBM and a per-NPU expansion: a rank's answers depend on its own accesses and tensors
        # only, so one rank may stand for its equivalent ranks (a job's activation offload). A
        # per-node expansion or the pool is shared by ranks chosen by rank number (rank //
        # num-npus-per-node) and serves them in arrival order: a representative's timing depends on
        # ranks it does not stand for, so every rank is simulated.
        self.fold_safe = self.time_fold_safe = config.memory_type in (NO_EXPANSION, PER_NPU)
        folding = context.inputs.folding
        # folded runs: simulated rank -> ranks it stands for (empty when not folded)
        self._weights = context.inputs.rank_weights
        self._simulated: Sequence[int] = (range(context.num_ranks) if folding is None
                                          else folding.representatives)
        self._representative: Sequence[int] = (range(context.num_ranks) if folding is None
                                               else folding.representative)
        self._scheduler = context.scheduler
        self._bw = config.bandwidth_gbps                    # bytes per ns
        self._bw_exact = exact(config.bandwidth_gbps, "bandwidth_gbps")
        latency = exact(config.latency_ns, "latency_ns")
        self._latency_exact = latency
        self._latency_whole = int(latency)                  # floor: latency >= 0
        self._latency_frac = latency - self._latency_whole
        self._remote_default = config.memory_type != NO_EXPANSION
        self._remote_latency = config.remote_mem_latency
        # bytes per second, as ASTRA-sim scales remote-mem-bw, for identical rounding (fifo)
        self._remote_bps = None if config.remote_mem_bw is None else config.remote_mem_bw * 1e9
        self._remote_exact = None if config.remote_mem_bw is None else exact(config.remote_mem_bw,
                                                                             "remote-mem-bw")
        self._fair = config.pool_sharing == "fair"
        self._npus_per_node = config.num_npus_per_node or 1
        if config.memory_type == PER_NODE and config.num_nodes is not None:
            capacity = config.num_nodes * self._npus_per_node
            if context.num_ranks > capacity:
                raise SimulationError(
                    f"memory plugin 'hbm': num-nodes {config.num_nodes} x num-npus-per-node "
                    f"{self._npus_per_node} = {capacity} NPUs, but the run has {context.num_ranks} ranks")
        self._local: list[SharedBandwidth | None] = [None] * context.num_ranks
        self._shared_remote: dict[int, SharedBandwidth] = {}
        self._free_at: dict[int, int] = {}     # FIFO remote queue -> time its last queued access ends
        self._loaded = [0] * context.num_ranks
        self._stored = [0] * context.num_ranks
        self.local_accesses = self.remote_accesses = 0
        self.queueing_delay_ns = self.queued_accesses = 0
        self.local_sharing_delay_ns = self.remote_sharing_delay_ns = 0
        self.capacity_bytes = (None if config.capacity_gib is None
                               else int(exact(config.capacity_gib, "capacity_gib") * GIB))
        self.oom_ranks: list[int] = []
        self._last_oom_ns = -1
        self._in_flight = 0            # accesses issued and not yet done (time folding's state)
        self._series_log = SeriesLog()
        self.tensors: TensorTracker | None = None
        # The engine reads `tracks_tensors` once per run and then calls node_issued /
        # node_completed for every node: bind them straight to the tracker's methods.
        self.tracks_tensors = config.track_tensors
        if config.track_tensors:
            self.tensors = TensorTracker(context.num_ranks, config.lifetime, config.count_host_tensors,
                                         self.capacity_bytes, config.series_points, self._trace_file,
                                         self._out_of_memory, config.tensor_nodes)
            self.node_issued = self.tensors.issued            # type: ignore[method-assign]  # see above
            self.node_completed = self.tensors.completed      # type: ignore[method-assign]  # see above
        elif config.capacity_gib is not None:
            context.warn("memory plugin 'hbm': capacity_gib is set but track_tensors is false, so "
                         "nothing is checked against it")

    # Bandwidth for roofline compute ---------------------------------------------------------------
    def bandwidth_gbps(self, rank: int) -> float:
        return self._bw

    # Timing ---------------------------------------------------------------------------------------
    def local_time_ns(self, size: int) -> int:
        """Duration of one local HBM access of `size` bytes that shares with nobody."""
        return int(self._latency_exact + size * self.config.channels / self._bw_exact)

    def remote_time_ns(self, size: int) -> int:
        """Duration of one remote access once served, as ASTRA-sim computes it (fifo)."""
        if self._remote_bps is None:
            raise SimulationError("memory plugin 'hbm': remote access without remote-mem-bw")
        return self._remote_latency + int(size / self._remote_bps * 1e9)

    def _queue_of(self, rank: int) -> int | None:
        """The remote memory serving `rank`: a FIFO / shared-bandwidth key, None = no queue (fifo)."""
        memory_type = self.config.memory_type
        if memory_type == PER_NODE:
            return rank // self._npus_per_node
        if memory_type == POOL:
            return 0
        return rank if self._fair else None

    def access(self, rank: int, node: NodeView, done: Callable[[int], None]) -> None:
        size = self._size(rank, node)
        remote = self._remote_default
        if node.has(LOCATION_ATTR):
            remote = self._is_remote(rank, node)
        if node.type == pb.MEM_STORE_NODE:
            self._stored[rank] += size
        else:
            self._loaded[rank] += size
        weight = self._weights.get(rank, 1) if self._weights else 1
        scheduler = self._scheduler
        self._in_flight += 1
        if not remote:
            self.local_accesses += weight
            link = self._local[rank]
            if link is None:
                link = self._local[rank] = SharedBandwidth(scheduler, self._bw_exact, self.config.channels)
            alone = int(self._latency_exact + link.alone_ns(size))
            self._shared(_Access(node.id, done, link, size, scheduler.now, self._latency_frac, alone, False,
                                 weight), self._latency_whole)
            return
        self.remote_accesses += weight
        queue = self._queue_of(rank)
        if self._fair:
            # fair: _queue_of gives every rank a queue (not narrowed at run time: a hot path)
            link = self._shared_remote.get(queue)  # type: ignore[arg-type]  # fair: never None
            if link is None:
                # once per queue; remote accesses need an expansion, which needs remote-mem-bw
                assert queue is not None and self._remote_exact is not None
                link = self._shared_remote[queue] = SharedBandwidth(scheduler, self._remote_exact)
            alone = self._remote_latency + int(link.alone_ns(size))
            self._shared(_Access(node.id, done, link, size, scheduler.now, Fraction(0), alone, True, weight),
                         self._remote_latency)
            return
        delay = self.remote_time_ns(size)
        if queue is not None:
            now = scheduler.now
            start = max(now, self._free_at.get(queue, 0))
            self._free_at[queue] = start + delay
            if start > now:
                self.queueing_delay_ns += start - now
                self.queued_accesses += 1
                delay += start - now
        scheduler.schedule(delay, self._done, (done, node.id))

    def _shared(self, access: _Access, latency_whole: int) -> None:
        if latency_whole:
            self._scheduler.schedule(latency_whole, self._transfer, access)
        else:
            self._transfer(access)

    def _transfer(self, access: _Access) -> None:
        access.link.start(access.size, self._transferred, access)

    def _transferred(self, access: _Access, leftover: Fraction) -> None:
        delay = int(leftover + access.latency_frac)     # the latency's fraction of a ns, rounded once
        scheduler = self._scheduler
        scheduler.schedule(delay, self._done, (access.done, access.node_id))
        extra = (scheduler.now + delay - access.issued - access.alone_ns) * access.weight
        if access.remote:
            self.remote_sharing_delay_ns += extra
        else:
            self.local_sharing_delay_ns += extra

    def _size(self, rank: int, node: NodeView) -> int:
        if not node.has("tensor_size"):
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): {node.type_name} has no "
                                  "'tensor_size' attribute; memory plugin 'hbm' needs the bytes it moves")
        try:
            size = node.int("tensor_size")
        except AttributeTypeError as exc:
            raise SimulationError(f"rank {rank}: {exc}") from None
        if size < 0:
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): tensor_size is {size}")
        return size

    def _is_remote(self, rank: int, node: NodeView) -> bool:
        try:
            location = node.str(LOCATION_ATTR).strip().lower()
        except AttributeTypeError as exc:
            raise SimulationError(f"rank {rank}: {exc}") from None
        if location == "local":
            return False
        if location != "remote":
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): {LOCATION_ATTR} is "
                                  f"{location!r}; expected 'local' or 'remote'")
        if not self._remote_default:
            raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}) asks for remote memory, "
                                  f"but memory-type is {NO_EXPANSION}: set memory-type and remote-mem-bw")
        return True

    # Tensor tracking ------------------------------------------------------------------------------
    def _trace_file(self, rank: int) -> Path | None:
        files = self.context.inputs.trace_files
        if rank < len(files):
            return Path(files[rank])
        self.context.warn("memory plugin 'hbm': the trace files are unknown (model built outside a "
                          "manifest run), so tensors are released by the 'issued' rule: when no issued, "
                          "unfinished node references them (a lower bound of the 'trace' rule)")
        return None

    def _out_of_memory(self, rank: int, node: NodeView, short: int, in_use: int) -> None:
        self._last_oom_ns = self._scheduler.now
        weight = self._weights.get(rank, 1) if self._weights else 1
        # folded: the simulated rank's equivalent ranks run out of memory at the same point
        who = f"rank {rank}" + (f" (and the {weight - 1} rank(s) equivalent to it)" if weight > 1 else "")
        message = (f"memory plugin 'hbm': {who} is out of memory at node {node.id} ({node.name!r}), "
                   f"t={self._scheduler.now} ns: its tensors need {in_use} bytes, capacity_gib "
                   f"{self.config.capacity_gib} is {self.capacity_bytes} bytes, {short} bytes short")
        if self.config.oom == "fail":
            raise SimulationError(message)
        if rank not in self.oom_ranks:
            self.oom_ranks.append(rank)
            self.context.warn(message + " (oom: warn, first time on this rank; the run goes on)")

    # Results --------------------------------------------------------------------------------------
    def _total(self, per_rank: Sequence[int]) -> int:
        """Sum over ranks of a per-rank figure; folded runs count each simulated rank once per rank
        it stands for (the others hold 0: they issue nothing)."""
        weights = self._weights
        if not weights:
            return sum(per_rank)
        return sum(per_rank[rank] * weight for rank, weight in weights.items())

    def _simulated_tensors(self) -> list[RankTensors]:
        """The tensor state of the simulated ranks (every rank unless folded), in rank order."""
        assert self.tensors is not None      # called only when tracking
        ranks = self.tensors.ranks
        return [ranks[rank] for rank in self._simulated]

    def _known_peaks(self) -> list[int]:
        return [s.peak for s in self._simulated_tensors() if s.allocations]

    def peak_memory_bytes(self) -> int | None:
        if self.tensors is None:
            return None
        known = self._known_peaks()
        return max(known) if known else None

    def summary(self) -> JsonObject:
        out: JsonObject = {
            "memory_type": self.config.memory_type,
            "bandwidth_gbps": self._bw,
            "channels": self.config.channels,
            "pool_sharing": self.config.pool_sharing,
            "capacity_gib": self.config.capacity_gib,
            "accesses": self.local_accesses + self.remote_accesses,
            "local_accesses": self.local_accesses,
            "remote_accesses": self.remote_accesses,
            "bytes_loaded": self._total(self._loaded),
            "bytes_stored": self._total(self._stored),
            "remote_queueing_delay_ns": self.queueing_delay_ns,
            "remote_queued_accesses": self.queued_accesses,
            "local_sharing_delay_ns": self.local_sharing_delay_ns,
            "remote_sharing_delay_ns": self.remote_sharing_delay_ns,
            "track_tensors": self.tensors is not None,
        }
        tracker = self.tensors
        if tracker is None:
            out["memory_series"] = {}
            return out
        # Folded runs: rank lists and series name simulated ranks only (the others issued nothing;
        # each shares its representative's figures, see results' "folding"), and the peak of a
        # representative is its class mates' too.
        states = self._simulated_tensors()
        planned = [s.rank for s in states if s.plan is not None]
        blind = [s.rank for s in states if not s.allocations]
        known = self._known_peaks()
        out.update({
            "lifetime": self.config.lifetime,
            "tensor_nodes": self.config.tensor_nodes,
            "lifetime_fallback_ranks": list(tracker.unplanned_ranks),
            "capacity_bytes": self.capacity_bytes,
            "oom": self.config.oom,
            "oom_ranks": sorted(self.oom_ranks),
            # null, not 0 B, when no rank's nodes listed a tensor: the trace cannot tell
            "peak_memory_bytes": self.peak_memory_bytes(),
            "ranks_without_tensors": blind,
            "storage_allocations": self._total([s.allocations for s in tracker.ranks]),
            "pre_pass_ranks": len(planned),
            "series_points": self.config.series_points,
            "memory_series": {str(s.rank): s.series.export() for s in states},
        })
        if not known:
            out["peak_memory_note"] = self._no_tensors_reason()
        return out

    def _no_tensors_reason(self) -> str:
        """Why a peak is unknown, with the settings that may have hidden tensors."""
        hints = []
        if not self.config.count_host_tensors:
            hints.append("tensors on 'cpu' count only with count_host_tensors: true")
        if self.config.tensor_nodes != "all":
            hints.append(f"tensor_nodes: {self.config.tensor_nodes} ignores "
                         + ("all but CPU operations" if self.config.tensor_nodes == "cpu" else "CPU operations"))
        # name only the nodes and tensors that count: with a tensor_nodes filter, other nodes may
        # well list device tensors
        nodes = {"all": "no node", "cpu": "no CPU operation",
                 "gpu": "no node other than a CPU operation"}[self.config.tensor_nodes]
        kind = "non-empty tensor" if self.config.count_host_tensors else "device tensor"
        return (f"{nodes} listed a {kind} in its inputs/outputs, so peak memory is unknown"
                + (f" ({'; '.join(hints)})" if hints else ""))

    def finish(self) -> None:
        """Warn about the simulated ranks whose peak is unknown rather than 0 B (no node listed a
        tensor); in folded runs the ranks that were not simulated issued nothing and say nothing."""
        if self.tensors is None:
            return
        ranks = [s.rank for s in self._simulated_tensors() if not s.allocations]
        if not ranks:
            return
        if len(ranks) == len(self._simulated):
            # the run-level figure is null only when no rank has one
            where, null = "every rank", "peak_memory_bytes is null"
        else:
            mates = " and the ranks equivalent to them" if self._weights else ""
            where = f"rank(s) {', '.join(map(str, ranks))}{mates}"
            null = "their peak_memory_bytes is null"
        self.context.warn(f"memory plugin 'hbm', {where}: {self._no_tensors_reason()}; {null} "
                          "(converted PyTorch traces, `chakra-sim generate transformer` and training "
                          "jobs with `tensors: true` list tensors)")

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """The ranks with the highest peak memory (at most 8), when tensors were tracked."""
        if self.tensors is None:
            return []
        simulated = self._simulated_tensors()
        ranks = sorted((s for s in simulated if s.peak), key=lambda s: (-s.peak, s.rank))[:8]
        columns = ["rank", "peak (bytes)", "peak (GiB)", "at (µs)"]
        if self.capacity_bytes is not None:
            columns.append("of capacity")
        rows = []
        for state in ranks:
            row = [str(state.rank), f"{state.peak:,}", f"{state.peak / GIB:,.3f}", f"{state.peak_ns / 1000:,.3f}"]
            if self.capacity_bytes is not None:
                row.append(f"{100 * state.peak / self.capacity_bytes:.1f}%")
            rows.append(row)
        title = "peak memory (tracked tensors)" + (" — highest 8 ranks" if len(self._simulated) > 8 else "")
        if self._weights:
            title += " — simulated ranks, one per class of equivalent ranks"
        return [(title, columns, rows)] if rows else []

    def rank_summary(self, rank: int) -> JsonObject:
        # folded runs: a rank that was not simulated has its representative's row (as results.json
        # gives every rank its representative's row)
        rank = self._representative[rank]
        row: JsonObject = {"memory_bytes_loaded": self._loaded[rank], "memory_bytes_stored": self._stored[rank]}
        if self.tensors is None:
            row["peak_memory_bytes"] = None
        else:
            state = self.tensors.ranks[rank]
            known = bool(state.allocations)   # a rank whose nodes list no tensor: unknown, not 0 B
            row["peak_memory_bytes"] = state.peak if known else None
            row["peak_memory_ns"] = state.peak_ns if known else None
        return row
