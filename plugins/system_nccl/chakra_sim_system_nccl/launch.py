"""How the host launches each collective: threads, GPUs per thread, processes, hosts, CUDA graphs.

NVIDIA nccl-tests prints it in the header of every run (src/common.cu, later src/util.cu):

    # nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
    # Blocking Enabled: wait for completion and barrier after each collective      (only with -z 1)
    #
    # Using devices
    #  Rank  0 Group  0 Pid 1006102 on pool0-01806 device  0 [0000:19:00] NVIDIA H100 80GB HBM3

- `nThread` (-t) host threads per process, `nGpus` (-g) GPUs each thread drives: one thread
  launches its GPUs' kernels one after the other. Training frameworks run one process per GPU
  (nThread 1 nGpus 1).
- `graph: N` (-G N, newer versions) replays the timed iterations N times from a CUDA graph: no
  per-collective launch on the host. Older versions print no `graph:` (no CUDA graphs: 0).
- `# Blocking Enabled: ...` (-z) is printed only when the host waits for each collective
  (newer versions print one of three variants); without it the host launches ahead.
- the device lines name each rank's process (`Pid`) and host (`on HOST`); older versions print
  no `Group`. A process drives nThread x nGpus ranks, so the device lines of a consistent
  header list nThread x nGpus x processes ranks.
- `-C 1` prints `cputime` instead of `time` as the column title: the host's time per
  iteration, not the collective's duration on the GPUs.

This module holds the concept only; chakra_sim_system_nccl.nccl_tests reads it from a log, and
`LaunchInfo.system_launch()` gives the `launch` section of the `nccl` system layer's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LaunchInfo"]


@dataclass(frozen=True)
class LaunchInfo:
    """How an nccl-tests run launched its collectives, as its header states."""

    threads_per_process: int                # nThread (-t)
    gpus_per_thread: int                    # nGpus (-g)
    processes: int | None = None            # distinct (host, Pid) in the device lines; None: no Pid printed
    hosts: tuple[str, ...] | None = None    # distinct host names, in order of first appearance; None: not printed
    cuda_graph_iters: int = 0               # graph: N (-G); 0 where the header prints none
    blocking: bool | None = None            # -z; None where the header is cut before it would tell
    cpu_time: bool = False                  # -C: the times are host CPU time per iteration
    line: int = 0                           # the `# nThread` line

    @property
    def gpus_per_process(self) -> int:
        return self.threads_per_process * self.gpus_per_thread

    @property
    def cuda_graph(self) -> bool:
        return self.cuda_graph_iters > 0

    @property
    def nodes(self) -> int | None:
        """Hosts named in the device lines (None: not printed)."""
        return len(self.hosts) if self.hosts is not None else None

    def system_launch(self) -> dict[str, Any]:
        """The `launch` section of the `nccl` system layer's config for this run."""
        return {"gpus_per_thread": self.gpus_per_thread, "cuda_graph": self.cuda_graph}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, hosts as a list."""
        return {"threads_per_process": self.threads_per_process, "gpus_per_thread": self.gpus_per_thread,
                "processes": self.processes, "hosts": list(self.hosts) if self.hosts is not None else None,
                "cuda_graph_iters": self.cuda_graph_iters, "blocking": self.blocking,
                "cpu_time": self.cpu_time, "line": self.line}
