"""Kineto traces (the PyTorch profiler's Chrome-trace JSON): CPU ops, runtime calls, GPU work.

Only complete events (`"ph": "X"`) matter. By category:

- CPU scopes: `cpu_op` / `Operator` and `user_annotation` (record functions) on host threads;
- runtime calls: `cuda_runtime` / `cuda_driver` / `Runtime` (kernel launches, synchronisations);
- GPU work: `kernel`, `gpu_memcpy`, `gpu_memset` (and the older `Kernel`, `Memcpy`, `Memset`)
  on streams.

`ts` and `dur` are microseconds (possibly fractional). Runtime calls and GPU work share a
`correlation` id; CPU scopes carry an `External id` and, since PyTorch 2.1, a
`Record function id` equal to the host trace's `rf_id`. `distributedInfo` (top level) gives the
rank, world size and process groups when the job was distributed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, cast

from chakra_core.tools.pytorch.errors import ConversionError
from chakra_core.tools.pytorch.jsonfile import load_json

CPU_CATEGORIES = frozenset({"cpu_op", "operator", "user_annotation"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                        "cudaMemcpy", "cudaMemcpy2D", "hipDeviceSynchronize", "hipStreamSynchronize",
                        "hipEventSynchronize", "hipMemcpy"})
"""Runtime calls after which the host thread has waited for the GPU work launched before them."""
ASYNC_COPY_CALLS = frozenset({"cudaMemcpyAsync", "cudaMemcpy2DAsync", "hipMemcpyAsync"})
"""Copies that block anyway when host memory is pageable (the converter checks their GPU copy)."""


@dataclass(slots=True)
class Event:
    index: int          # position in traceEvents (a stable tie-breaker)
    name: str
    category: str       # lower case
    tid: str
    ts: float
    dur: float
    ext_id: int | None = None
    rf_id: int | None = None
    correlation: int | None = None
    stream: int | None = None
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class KinetoTrace:
    path: str
    cpu: list[Event]
    runtime: list[Event]
    gpu: list[Event]
    distributed: dict[str, Any]
    warnings: list[str]

    @property
    def rank(self) -> int | None:
        value = self.distributed.get("rank")
        return value if isinstance(value, int) else None

    @property
    def world_size(self) -> int | None:
        value = self.distributed.get("world_size")
        return value if isinstance(value, int) else None

    @property
    def has_record_function_ids(self) -> bool:
        return any(e.rf_id is not None for e in self.cpu)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A time in µs: a JSON number, or a decimal string (some exporters write those)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def load_kineto_trace(path: str | os.PathLike[str]) -> KinetoTrace:
    doc = load_json(path, "Kineto trace")
    spath = str(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ConversionError(f"{spath}: not a Kineto trace: expected a JSON object with a "
                              "'traceEvents' list")
    cpu: list[Event] = []
    runtime: list[Event] = []
    gpu: list[Event] = []
    malformed = 0
    for index, raw in enumerate(events):
        if not isinstance(raw, dict) or raw.get("ph") != "X":
            continue
        category = str(raw.get("cat", "")).lower()
        if category in CPU_CATEGORIES:
            bucket = cpu
        elif category in RUNTIME_CATEGORIES:
            bucket = runtime
        elif category in GPU_CATEGORIES:
            bucket = gpu
        else:
            continue
        ts, dur = _number(raw.get("ts")), _number(raw.get("dur"))
        if ts is None or dur is None or dur < 0:
            malformed += 1
            continue
        # mypy does not narrow a call's result: the isinstance check makes it a dict
        args = cast("dict[str, Any]", raw.get("args")) if isinstance(raw.get("args"), dict) else {}
        stream = _int(args.get("stream"))
        tid = raw.get("tid")
        bucket.append(Event(index, str(raw.get("name", "")), category, str(tid), ts, dur,
                            _int(args.get("External id")), _int(args.get("Record function id")),
                            _int(args.get("correlation")), stream if stream is not None else _int(tid),
                            args if bucket is gpu else {}))
    warnings = []
    if malformed:
        warnings.append(f"{spath}: {malformed} event(s) without a numeric ts/dur ignored")
    if not cpu:
        warnings.append(f"{spath}: no CPU operator events (cat cpu_op / user_annotation): nothing to link")
    info = doc.get("distributedInfo")
    return KinetoTrace(spath, cpu, runtime, gpu, info if isinstance(info, dict) else {}, warnings)
