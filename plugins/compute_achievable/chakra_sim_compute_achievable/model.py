"""Compute time at achievable, not peak, throughput.

- GEMM nodes (`kernel` gemm/bmm with `gemm_m/n/k/batch`; a grouped GEMM's own m or k per group in
  `gemm_m_list` / `gemm_k_list`): the maximum achievable matmul rate (MAMF) with tile and wave
  quantization (`gemm.py`), or HBM-bound;
- attention nodes (`kernel` attention): FLOPs at the FlashAttention papers' achieved rate for the
  pass and sequence length (interpolated in log2 of the sequence length);
- other nodes with num_ops: max(num_ops / CUDA-core fp32 peak, tensor_size / achievable HBM);
  nodes named like matmuls (aten::mm, addmm, conv ...) without shape attributes at the MAMF;
- every modelled kernel adds the GPU's back-to-back kernel gap;
- CPU ops and nodes without num_ops replay their traced duration, as the roofline does.

What a step adds to kernels benchmarked alone is in `effects.py` and `host.py`, one switch each.
"""

from __future__ import annotations

import math
import re
from typing import Any, Hashable

from chakra_core import (
    AttributeCache, ComputeModel, FoldView, GpuLoad, JsonObject, LayerContext, NodeView, SimulationError,
    ValidationInputs, device_mismatch, load_profile, node_dtype, profile_problems, replay_time_ns,
)
from chakra_sim_compute_achievable.config import AchievableConfig
from chakra_sim_compute_achievable.section import (KEY, AchievableSpec, AttentionLibraries,
                                                   attention_ceiling, interpolate as _interpolate, matmul_ceiling)
from chakra_sim_compute_achievable.effects import EffectFactors
from chakra_sim_compute_achievable.sharing import KernelsInFlight, Running, until_first_end
from chakra_sim_compute_achievable.gemm import gemm_groups, gemm_time, grouped_gemm_time
from chakra_sim_compute_achievable.provenance import derived_rates, kernel_summary, kernel_tables, refusal
from chakra_sim_compute_achievable.kernel_times import KernelTimes, KernelTimesError, load_kernel_times
from chakra_sim_compute_achievable.windowed import band

KINDS = ("gemm", "matmul", "attention", "other", "measured", "replayed")
_GEMM, _MATMUL, _ATTENTION, _OTHER, _MEASURED, _REPLAYED = range(len(KINDS))
# bytes per element; the block-scaled formats carry an 8-bit scale per 32 (MX) or 16 (NVFP4) elements
_WIDTH = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "mxfp8": 1 + 1 / 32,
          "nvfp4": 0.5 + 1 / 16}
# PyTorch / cuBLAS / CUTLASS names of tensor-core kernels that carry no gemm_* attributes
_MATMUL_NAME = re.compile(r"gemm|matmul|addmm|bmm|aten::mm\b|aten::linear|conv|cutlass|xmma", re.IGNORECASE)
_Q_TILE = 128
"""Query (forward) or key (backward) rows per FlashAttention CTA (Br = Bc = 128 at head dim 128 in
both papers): fewer tiles than SMs leave SMs idle, which the papers' large batches never show."""
_HBM_FLOOR = 0.1
"""Share of the HBM bandwidth memory-bound work keeps however much communication copies take."""


class _Work:
    """How one node is timed: its kind and FLOPs, its time alone on the GPU (ns, None to replay),
    and what a kernel beside communication needs to be timed again (`shape`)."""

    __slots__ = ("ns", "kind", "flops", "shape", "margin", "launches", "sync", "gaps")

    def __init__(self, ns: int | None, kind: int, flops: float, shape: tuple[Any, ...] = (), margin: int = 0,
                 launches: int = 1, sync: bool = False):
        self.ns, self.kind, self.flops, self.shape, self.margin = ns, kind, flops, shape, margin
        self.launches, self.sync = launches, sync   # the host's kernels for the node; the host waits for it
        # back-to-back gaps: a grouped GEMM's per-expert GEMMs run on 4 streams, beside each other's gaps
        self.gaps = launches if shape and shape[0] != "gemm" else 1


class AchievableCompute(ComputeModel):
    name = "achievable"
    fidelity = ("achievable throughput: GEMMs at the measured max achievable matmul FLOP/s with tile and "
                "wave quantization and their output written after the main loop, attention at FlashAttention-2/3 "
                "efficiencies, other kernels against the CUDA-core peak and measured HBM bandwidth, plus a "
                "per-kernel gap; beside communication on the SMs and HBM bandwidth it leaves, at the clock a "
                "power-capped load sustains, waiting for the host's launches, at the job's slowest chip's pace "
                "(compute.effects); no L2 reuse")
    Config = AchievableConfig
    fold_safe = True            # the answer is a pure function of the node
    time_fold_safe = True       # ... and of the communication in flight and the host's lead (time_fold_state)

    config: AchievableConfig

    @classmethod
    def config_problems(cls, config: AchievableConfig,
                        inputs: ValidationInputs) -> list[tuple[tuple[str | int, ...], str]]:
        problems = profile_problems(config.profile, inputs.base_dir)
        profile = None if problems else load_profile(config.profile, inputs.base_dir)
        if profile is not None and profile.section(KEY, AchievableSpec) is None:
            problems.append((("profile",), f"profile '{config.profile}' has no gpu.achievable section"))
        elif profile is not None and (refused := refusal(profile)):
            problems.append((("profile",), refused))
        if config.kernel_times is not None:
            try:
                load_kernel_times(inputs.base_dir / config.kernel_times)
            except KernelTimesError as exc:
                problems.append((("kernel_times",), str(exc)))
        return problems

    def __init__(self, config: AchievableConfig, context: LayerContext) -> None:
        super().__init__(config, context)
        profile = self.profile = load_profile(config.profile, context.base_dir)
        ach = profile.section(KEY, AchievableSpec)
        if ach is None:
            raise SimulationError(f"compute.profile: profile '{profile.name}' has no gpu.achievable section "
                                  "(achievable matmul rates, HBM bandwidth, SM count); see docs/hardware.md")
        if refused := refusal(profile):   # another GPU's measurements under this one's peaks
            raise SimulationError(f"compute.profile: {refused}")
        self.achievable: AchievableSpec = ach
        self._derived = derived_rates(ach)
        self._peak = {d: s.value * 1e12 for d, s in profile.gpu.peak_tflops.items() if s.value > 0}
        # rates count only for data types with a peak (the check achieved <= peak needs one)
        self._mamf = {d: s.value * 1e12 for d, s in ach.matmul_tflops.items() if s.value > 0 and d in self._peak}
        self._attention = AttentionLibraries(ach, self._peak, profile.name)
        self._hbm = ach.hbm_gbps.value * 1e9
        self._sms = int(ach.sm_count.value)
        gap_us = ach.kernel_gap_us.value if config.launch_overhead_us is None else config.launch_overhead_us
        self._gap = gap_us * 1e-6
        if "fp32" not in self._peak:
            raise SimulationError(f"profile '{profile.name}' has no fp32 peak: non-tensor-core kernels need it")
        self._vector = self._peak["fp32"]
        self.dtype = config.dtype
        if self.dtype not in self._mamf:
            raise SimulationError(f"compute.dtype: profile '{profile.name}' has no achievable {self.dtype} matmul "
                                  f"rate (it has {', '.join(self._mamf)})")
        self._times: KernelTimes | None = None
        if config.kernel_times is not None:
            try:
                self._times = load_kernel_times(context.base_dir / config.kernel_times)
            except KernelTimesError as exc:
                raise SimulationError(f"compute.kernel_times: {exc}") from None
        self._warned: set[str] = set()
        self._fastest = 0.0                     # FLOP/s of the fastest modelled kernel so far
        # a rate kept from a parent profile whose peak, bandwidth or model this one changed times
        # this GPU's kernels with another GPU's measurement: say so (docs/hardware.md)
        for rate in profile.inherited("gpu.achievable."):
            self._warn(f"inherited:{rate.key}", f"profile '{profile.name}': {rate.message()}")
        self._by_attrs = AttributeCache(lambda node: self._work(node) if node.has("kernel") else None)
        self._by_name: dict[bytes, _Work] = {}
        self._device_checked = False
        self._weights = context.inputs.rank_weights
        # per kind: [nodes, ns, FLOPs], weighted by the ranks each simulated rank stands for
        self._stats = [[0, 0, 0.0] for _ in KINDS]
        self._setup_effects(config, context)

    def _setup_effects(self, config: AchievableConfig, context: LayerContext) -> None:
        """The factors and per-rank state of `compute.effects` (effects.py)."""
        ach, on = self.achievable, config.effects
        factors = EffectFactors(ach, on, context.num_ranks)
        # compute-bound rates: the sustained share of the benchmarks', at the slowest chip's pace
        self._compute_scale, self.slowest_excess, self._host = factors.compute_scale, factors.slowest_excess, factors.host
        self._sharing = self.retimes = on.comm_sms or on.comm_hbm
        self._in_flight = KernelsInFlight()
        self._stream_k = ach.gemm_schedule == "stream_k"
        self._epilogue = on.gemm_epilogue
        self._causal_backward = on.causal_backward
        self._loaded: dict[tuple[int, int, int], int] = {}   # (work id, free SMs, HBM GB/s) -> ns
        if factors.missing:
            self._warn("effects", f"profile '{self.profile.name}' has no source for {', '.join(factors.missing)}; "
                       "those effects are left out (docs/hardware.md)")

    def rate_ceiling_flops(self) -> float | None:
        """The fastest rate this run timed a modelled kernel at (its FLOPs over its time); measured
        and replayed times are not the model's, and bound nothing."""
        return self._fastest or None

    def matmul_ceiling_flops(self, dtype: str) -> float | None:
        return matmul_ceiling(self.achievable, dtype)

    def attention_ceiling_flops(self, dtype: str, backward: bool) -> float | None:
        return attention_ceiling(self.achievable, dtype, backward)

    # Per node -------------------------------------------------------------------------------------
    def compute_time_ns(self, rank: int, node: NodeView) -> int | None:
        work = self._cached_work(node)
        if work.kind == _REPLAYED and not self._device_checked:
            self._check_device(rank)
        duration = work.ns
        weight = self._weights.get(rank, 1) if self._weights else 1
        if duration is not None and work.kind != _MEASURED:
            now, whole, shared = self.context.scheduler.now, duration, None
            if self._sharing and work.shape:
                load = self.context.gpu_load(rank)
                if load.ctas > work.margin or load.hbm_gbps:
                    whole = self._under(work, load)
                    duration, shared = until_first_end(whole, duration, load.until_ns, now)
            running = duration
            if self._host is not None:
                duration = self._host.delayed(rank, now, duration, work.launches, work.sync)
            if self._sharing and work.shape and self.context.comm_start is not None:   # re-timed: sharing.py
                begins = now + duration - running   # after the host's launch: its shares count from then
                self._in_flight.add(rank, node.id, Running(work, weight, begins, whole, work.ns or 0, None if shared is None
                                                           else begins + shared, now + duration), now)
        stats = self._stats[work.kind]
        stats[0] += weight
        stats[1] += weight * (replay_time_ns(node) if duration is None else duration)
        stats[2] += weight * work.flops
        return duration

    def retime(self, rank: int) -> list[tuple[int, int]]:
        """Communication started beside `rank`'s kernels: their new ends (sharing.py)."""
        load = self.context.gpu_load(rank)
        moved = self._in_flight.retime(rank, self.context.scheduler.now, lambda kernel: (
            self._under(kernel.work, load) if load.ctas > kernel.work.margin or load.hbm_gbps else kernel.alone),
            load.until_ns)
        for _, kernel, old in moved:
            self._stats[kernel.work.kind][1] += kernel.weight * (kernel.end - old)
            if kernel.work.sync and self._host is not None:
                self._host.synced[rank] = kernel.end   # the host waits for its new end
        return [(node_id, kernel.end) for node_id, kernel, _ in moved]

    # Time folding (chakra_core.contract.time_folding): the host's lead and the kernels in flight --------
    def time_fold_state(self, now: int, view: FoldView) -> Hashable:
        return () if self._host is None else self._host.time_fold_state(now), self._in_flight.state(now, view)

    def statistics_snapshot(self) -> object:
        return [list(kind) for kind in self._stats], {} if self._host is None else self._host.leads(self.context.scheduler.now)

    def advance_statistics(self, periods: int, before: Any, after: Any) -> None:
        self._stats = [[now + periods * (b - a) for now, a, b in zip(*kind)] for kind in zip(self._stats, before[0], after[0])]

    def time_fold_refusal(self, start_ns: int, before: Any, after: Any) -> str:
        return "" if self._host is None else self._host.time_fold_refusal(start_ns, before[1], after[1])

    def alone_time_ns(self, node: NodeView) -> int | None:
        """With the GPU to itself and the host ahead: the kernel's own time (nothing counted)."""
        work = self._cached_work(node)
        return work.ns

    def _under(self, work: _Work, load: GpuLoad) -> int:
        """A kernel's whole time on the SMs and HBM bandwidth that communication in flight leaves it."""
        on = self.config.effects
        busy = max(0, load.ctas - work.margin) if on.comm_sms else 0   # the margin's SMs take the first
        hbm = int(load.hbm_gbps) if on.comm_hbm else 0
        key = (id(work), busy, hbm)
        loaded = self._loaded.get(key)
        if loaded is None:
            bandwidth = max(self._hbm * _HBM_FLOOR, self._hbm - hbm * 1e9)
            loaded = self._loaded[key] = self._ns(self._seconds(work, busy, bandwidth) + work.gaps * self._gap,
                                                  work.flops, None, None)
        return loaded

    def _cached_work(self, node: NodeView) -> _Work:
        """`_work`, shared by nodes with the same attributes (a training step repeats each kernel
        for every micro-batch); kept with the node itself when measured times are matched by name."""
        if self._times is not None and self._times.patterns:
            work = node.memo.get(self)
            if work is None:
                work = node.memo[self] = self._work(node)
            return work
        work = self._by_attrs(node)
        if work is None:      # no `kernel` attribute: matmuls are recognised by name
            key = node.attrs_key() + node.name.encode()
            work = self._by_name.get(key) or self._by_name.setdefault(key, self._work(node))
        return work

    def _work(self, node: NodeView) -> _Work:
        """How a node is timed: a function of the node alone."""
        if node.is_cpu_op:
            return _Work(None, _REPLAYED, 0.0)
        kernel = node.str("kernel", "").lower() if node.has("kernel") else ""
        measured = self._measured(node, kernel)
        if measured is not None:
            flops = float(node.int("num_ops", 0)) if node.has("num_ops") else 0.0
            return _Work(self._ns(measured + self._gap, flops, None, node), _MEASURED, flops)
        if kernel in ("gemm", "bmm") and node.has("gemm_m"):
            return self._timed(self._gemm_shape(node), _GEMM, node)
        if kernel == "attention":
            return self._timed(self._attention_shape(node), _ATTENTION, node)
        if not node.has("num_ops"):
            return _Work(None, _REPLAYED, 0.0)
        num_ops = float(node.int("num_ops"))
        tensor_size = float(node.int("tensor_size", 0))
        if kernel in ("gemm", "bmm") or _MATMUL_NAME.search(node.name):   # a matmul without its shape
            dtype, rate = self._matmul_rate(node)
            return self._timed(("rate", num_ops, tensor_size, rate, self._peak[dtype]), _MATMUL, node)
        return self._timed(("rate", num_ops, tensor_size, self._vector, self._vector), _OTHER, node)

    def _timed(self, shape: tuple[Any, ...], kind: int, node: NodeView) -> _Work:
        """A modelled kernel's work: its time with the whole GPU, checked against its peak."""
        flops, peak = shape[1], shape[-1]
        margin = node.int("sm_margin", 0) if node.has("sm_margin") else 0
        launches, sync = max(1, node.int("launches", 1)), node.bool("host_sync", False)
        work = _Work(None, kind, flops, shape, margin if self.config.effects.comm_sms else 0, launches, sync)
        work.ns = self._ns(self._seconds(work, 0, self._hbm) + work.gaps * self._gap, flops, peak, node)
        self._fastest = max(self._fastest, flops / (work.ns * 1e-9))
        return work

    def _seconds(self, work: _Work, busy: int, hbm: float) -> float:
        """Seconds a modelled kernel takes beside communication holding `busy` SMs (beyond its own
        SM margin) and leaving `hbm` B/s of HBM, without the launch gap."""
        shape, scale = work.shape, self._compute_scale
        sms = self._sms - work.margin
        if shape[0] == "gemm":
            _, _, m, n, k, batch, mamf, width, c_bytes, chunks, groups, _ = shape
            if groups:   # each group its own m or k: a mixture of experts' grouped GEMM
                return grouped_gemm_time(groups, n, mamf * scale, hbm, width, self._sms, sms,
                                         c_bytes if self._epilogue else 0.0, busy, self._stream_k).seconds
            one = gemm_time(-(-m // chunks), n, k, batch, mamf * scale, hbm, width, self._sms, sms,
                            c_bytes if self._epilogue else 0.0, busy, self._stream_k).seconds
            return float(chunks * one + (chunks - 1) * self._gap)
        sms = max(1, sms - busy)
        if shape[0] == "attention":
            _, flops, rate, ctas, _ = shape
            full = flops / (rate * scale * min(1.0, ctas / self._sms)) if flops else 0.0
            return float(full * max(1.0, min(ctas, self._sms) / sms))   # fewer SMs than CTAs: more waves
        _, ops, nbytes, rate, _ = shape
        return float(max(ops / (rate * scale), nbytes / hbm))

    def _measured(self, node: NodeView, kernel: str) -> float | None:
        """A measured time in seconds from kernel_times, or None."""
        if self._times is None:
            return None
        micros = None
        if kernel in ("gemm", "bmm") and self._times.shapes:
            micros = self._times.by_shape((kernel, node.int("gemm_m"), node.int("gemm_n"), node.int("gemm_k"),
                                           node.int("gemm_batch", 1), self._dtype(node, self._mamf, "matmul")[0]))
        micros = self._times.by_name(node.name) if micros is None else micros
        return None if micros is None else micros * 1e-6

    def _gemm_shape(self, node: NodeView) -> tuple[Any, ...]:
        m, n, k = node.int("gemm_m"), node.int("gemm_n"), node.int("gemm_k")
        batch = node.int("gemm_batch", 1)
        if min(m, n, k, batch) <= 0:
            raise SimulationError(f"node {node.id} ({node.name!r}): gemm_m/n/k/batch must be > 0, "
                                  f"found {m}, {n}, {k}, {batch}")
        dtype, mamf = self._matmul_rate(node)
        width = _WIDTH[dtype]
        # what the epilogue moves per element of C: its write (bf16 unless said), and an accumulating GEMM's read
        c_bytes = float(node.int("gemm_c_bytes")) if node.has("gemm_c_bytes") else float(max(width, 2))
        # gemm_chunks: that many GEMMs of m / chunks rows one after the other (TE's communication overlap)
        chunks = max(1, node.int("gemm_chunks", 1)) if node.has("gemm_chunks") else 1
        groups = gemm_groups(node.raw("gemm_m_list"), node.raw("gemm_k_list"), m, k, batch, node.id, node.name)
        flops = 2.0 * n * sum(a * b for a, b in groups) if groups else 2.0 * m * n * k * batch
        return ("gemm", flops, m, n, k, batch, mamf, width, c_bytes, chunks, groups, self._peak[dtype])

    def _attention_shape(self, node: NodeView) -> tuple[Any, ...]:
        flops = float(node.int("num_ops"))
        passname = node.str("attn_pass", "forward").lower()
        if passname not in ("forward", "backward"):
            raise SimulationError(f"node {node.id} ({node.name!r}): attn_pass {passname!r} is not "
                                  "forward or backward")
        attention = self._attention.of(node.str("attn_kernel", ""), f"node {node.id} ({node.name!r})")
        dtype, _ = self._dtype(node, attention, "attention")
        curves = attention.get(dtype, {})
        if passname not in curves and dtype != self.dtype:
            self._warn(f"attention:{dtype}:{passname}",
                       f"profile '{self.profile.name}' has no {dtype} {passname} attention curve; such "
                       f"kernels are timed with the {self.dtype} curve at the {self.dtype} peak")
            dtype, curves = self.dtype, attention.get(self.dtype, {})
        seq_q, seq_kv = node.int("attn_seq_q"), node.int("attn_seq_kv")
        window = node.int("attn_window") if node.has("attn_window") else 0
        window = window if 0 < window < seq_kv else 0   # windowed.py: the band's tiles, non-causal rate
        causal = node.bool("attn_causal", False) and not window
        curve = curves.get("forward_causal") if causal and passname == "forward" else None
        curve = curve or curves.get(passname)
        if curve is None:
            raise SimulationError(f"profile '{self.profile.name}' has no {dtype} {passname} attention curve "
                                  "(gpu.achievable.attention) for attention nodes")
        seq, share = band(seq_q, seq_kv, window, _Q_TILE) if window else (math.sqrt(seq_q * seq_kv), 1.0)
        rate = _interpolate(curve, seq) * 1e12 * share
        if causal and passname == "backward" and self._causal_backward:
            # no causal backward curve: the causal forward's share of the non-causal forward
            forward, causal_fwd = curves.get("forward"), curves.get("forward_causal")
            if forward is not None and causal_fwd is not None:
                rate *= _interpolate(causal_fwd, seq) / _interpolate(forward, seq)
        # too few CTAs to fill the GPU: a wave of them, partly empty, costs a whole wave
        rows = seq_q if passname == "forward" else seq_kv
        ctas = node.int("attn_batch", 1) * -(-rows // _Q_TILE)
        return ("attention", flops, rate, ctas, self._peak[dtype])

    # Data types and rates -------------------------------------------------------------------------
    def _dtype(self, node: NodeView, rates: dict[str, Any], what: str) -> tuple[str, bool]:
        """(data type the node is timed at, whether it fell back to compute.dtype)."""
        dtype, unknown = node_dtype(node)
        if unknown is not None:
            self._warn(f"attr:{unknown}", f"node {node.id} ({node.name!r}) has dtype attribute {unknown!r}, "
                       "not a known data type; such nodes are timed by their inputs, else compute.dtype")
        if dtype is None:
            return self.dtype, True
        if dtype == "fp32" and self.config.fp32_as_tf32:
            dtype = "tf32"
        if dtype not in rates:
            # e.g. fp8 on an A100 (no FP8 tensor cores): the model would run in compute.dtype instead
            self._warn(f"{what}:{dtype}", f"profile '{self.profile.name}' ({self.profile.gpu.model}) has no "
                       f"achievable {dtype} {what} rate; {dtype} {what} nodes are timed as {self.dtype} "
                       "(compute.dtype)")
            return self.dtype, True
        return dtype, False

    def _matmul_rate(self, node: NodeView) -> tuple[str, float]:
        dtype, _ = self._dtype(node, self._mamf, "matmul")
        return dtype, self._mamf[dtype]

    def _ns(self, seconds: float, flops: float, peak: float | None, node: NodeView | None) -> int:
        """Seconds to integer ns, checking that the time never implies more than the peak."""
        ns = max(1, int(math.ceil(seconds * 1e9)))
        if peak is not None and node is not None and flops > peak * ns * 1e-9 * (1 + 1e-9):
            raise SimulationError(f"internal error in compute plugin 'achievable': node {node.id} "
                                  f"({node.name!r}) would reach {flops / ns / 1e3:.1f} TFLOP/s, above the "
                                  f"peak {peak / 1e12:g}")
        return ns

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.context.warn(f"achievable: {message}")

    def _check_device(self, rank: int) -> None:
        """Replayed durations were measured on the trace's device: say so if it is not this GPU."""
        self._device_checked = True
        files = self.context.inputs.trace_files
        if not files:
            return
        message = device_mismatch(files[min(rank, len(files) - 1)], self.profile)
        if message:
            self._warn("device", message)

    # Results --------------------------------------------------------------------------------------
    def summary(self) -> JsonObject:
        return kernel_summary(self.profile.name, KINDS, self._stats, max(self._peak.values()), self._derived)

    def terminal_tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        return kernel_tables(KINDS, self._stats, self._derived)
