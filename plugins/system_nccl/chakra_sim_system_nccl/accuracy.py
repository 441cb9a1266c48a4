"""Predicted vs measured: simulate the runs an nccl-tests log describes and compare (`chakra-sim accuracy`).

For one log (chakra_sim_system_nccl.nccl_tests):

1. `plan_log` works out the runs: the collective, the ranks, the nodes (the hosts of the
   header's device lines, else ranks / the profile's GPUs per node), how the host launched
   each collective (`LaunchInfo`: GPUs per thread, CUDA graph), and every size within
   [min_bytes, max_bytes] of one placement (out-of-place by default) with its measured time.
2. `simulate_plan` runs each size through the real simulator, as `chakra-sim run` would: a
   trace of one collective on every rank, with the system layer
   `{"plugin": "nccl", "profile": P, "gpus-per-node": G, "launch": {...}}`. nccl-tests
   counts an all-gather by its output, so its per-rank share is size // ranks.
   `nccl_choices` gives NCCL's algorithm, protocol and channels for each size
   (chakra_sim_system_nccl.model).
3. `evaluate` does both; `LogResult` holds the errors, their geometric mean
   exp(mean |ln(predicted / measured)|) - 1 and the same per size band (`BANDS`).
4. `report_json` and `plot_png` present one or several results.

Problems with a log raise `ManifestError` located at `path:line` (the parser's own errors
are raised the same way).
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chakra_core import ManifestError, Profile
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.calibrate import COLLECTIVE_OF_TEST, geomean_error
from chakra_sim_system_nccl.launch import LaunchInfo
from chakra_sim_system_nccl.nccl_tests import NcclTestsLog, busbw_factor

if TYPE_CHECKING:
    from chakra_core import PluginHost

__all__ = ["COLLECTIVE_OF_TEST", "BANDS", "Size", "Plan", "SizeResult", "LogResult", "plan_log",
           "simulate_plan", "nccl_model", "nccl_choices", "evaluate", "geomean_error", "band_errors",
           "report_json", "plot_png", "size_label"]

_KIB, _MIB = 1 << 10, 1 << 20
BANDS: tuple[tuple[str, int, float], ...] = (
    ("below 1 KiB", 0, _KIB),
    ("1 KiB-1 MiB", _KIB, _MIB),
    ("1 MiB-256 MiB", _MIB, 256 * _MIB),
    ("from 256 MiB", 256 * _MIB, math.inf),
)
"""Size bands (name, from bytes, up to bytes excluded) the error is also reported for."""


@dataclass(frozen=True)
class Size:
    """One measured size of a log: one run to simulate."""

    nbytes: int          # as nccl-tests prints it (all_gather: the gathered output)
    measured_us: float
    dtype: str
    redop: str
    root: int
    line: int            # where the log prints it


@dataclass(frozen=True)
class Plan:
    """The runs one log describes, on one profile."""

    log: str                     # path
    test: str                    # the nccl-tests collective (all_reduce, alltoall, ...)
    collective: str              # the model's (all_reduce, all_to_all, ...)
    ranks: int
    nodes: int
    gpus_per_node: int
    profile: str                 # as given: a shipped name or a .yaml file
    launch: LaunchInfo | None
    in_place: bool
    sizes: tuple[Size, ...]
    nccl_version: tuple[int, int, int] | None = None   # the log's NCCL release (its tuner chooses)
    algorithms: tuple[str, ...] = ()   # NCCL_ALGO as the run set it (empty: NCCL chooses among all)
    protocols: tuple[str, ...] = ()    # NCCL_PROTO

    @property
    def launch_config(self) -> dict[str, Any]:
        """The `launch` section of the system layer's config (the layer's defaults without a header)."""
        return self.launch.system_launch() if self.launch is not None else {"gpus_per_thread": 1,
                                                                            "cuda_graph": False}

    def system(self) -> dict[str, Any]:
        """The `system` section of the manifest each size is simulated with (the log's NCCL release
        chooses, where it prints one)."""
        system = {"plugin": "nccl", "profile": self.profile, "gpus-per-node": self.gpus_per_node,
                  "launch": self.launch_config}
        if self.nccl_version is not None:
            system["nccl_version"] = ".".join(map(str, self.nccl_version))
        if self.algorithms:
            system["algorithms"] = list(self.algorithms)
        if self.protocols:
            system["protocols"] = list(self.protocols)
        return system

    def comm_size(self, size: Size) -> int:
        """The trace's comm_size for a size: nccl-tests counts an all-gather by its output."""
        return size.nbytes // self.ranks if self.collective == nccl.ALL_GATHER else size.nbytes

    def model_bytes(self, size: Size) -> int:
        """The bytes NCCL's model is asked about (as the layer asks it: all-gather by its output)."""
        return self.comm_size(size) * self.ranks if self.collective == nccl.ALL_GATHER else size.nbytes


@dataclass(frozen=True)
class SizeResult:
    size: Size
    predicted_us: float
    choice: nccl.Choice

    @property
    def log_error(self) -> float:
        """ln(predicted / measured)."""
        return math.log(self.predicted_us / self.size.measured_us)

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_us / self.size.measured_us - 1


@dataclass(frozen=True)
class LogResult:
    plan: Plan
    sizes: tuple[SizeResult, ...]

    @property
    def geomean_error(self) -> float:
        return geomean_error([result.log_error for result in self.sizes])

    @property
    def bands(self) -> dict[str, tuple[float, int]]:
        return band_errors(self.sizes)


# --------------------------------------------------------------------------- planning

def _location(log: NcclTestsLog, line: int | None) -> str:
    return f"{log.path}:{line}" if line else log.path


def _first_line(log: NcclTestsLog) -> int | None:
    return log.line_numbers[0] if log.line_numbers else None


def plan_log(log: NcclTestsLog, profile: Profile, profile_name: str, *, in_place: bool = False,
             min_bytes: int = 1024, max_bytes: int | None = None, algorithms: Sequence[str] = (),
             protocols: Sequence[str] = ()) -> Plan:
    """The runs `log` describes, to simulate on `profile` (named `profile_name` in the system
    config); `algorithms` and `protocols`: NCCL_ALGO and NCCL_PROTO as the run set them (logs do
    not print them). ManifestError at `path:line` when the log cannot be simulated as it is."""
    first = _first_line(log)
    if log.launch is None and log.columns_line is None and not log.times_from_busbw:
        raise ManifestError([(_location(log, first), "no nccl-tests header: neither the column titles "
                              "('#  size  count  type  redop  root  time  algbw  busbw ...') nor the "
                              "'# nThread N nGpus G ...' line precede the results; chakra-sim accuracy needs "
                              "the output of an nccl-tests program (all_reduce_perf ...) as it prints it")])
    collective = COLLECTIVE_OF_TEST.get(log.collective)
    if collective is None or collective not in nccl.COLLECTIVES:
        known = ", ".join(f"{test}_perf" for test, name in COLLECTIVE_OF_TEST.items() if name in nccl.COLLECTIVES)
        raise ManifestError([(_location(log, log.columns_line or first),
                              f"the log measures {log.collective} ({log.collective}_perf), which the NCCL "
                              f"model cannot simulate; it simulates {known}")])
    if log.ranks is None:
        raise ManifestError([(_location(log, first), "the number of ranks is unknown: the log has no device "
                              "list ('#  Rank  0 ... device ...') and its numbers do not tell")])
    ranks = log.ranks
    if ranks < 2:
        raise ManifestError([(_location(log, first), f"{ranks} rank: a collective needs at least 2")])
    launch = log.launch
    per_node_max = profile.gpus_per_node
    host = profile.node.gpus_per_host   # an NVLink domain of several hosts (an NVL72 rack's trays)
    if launch is not None and launch.hosts:
        nodes = len(launch.hosts)
        where = _location(log, launch.line)
        if ranks % nodes:
            raise ManifestError([(where, f"the device lines spread {ranks} ranks over {nodes} hosts unevenly; "
                                  "the simulator numbers ranks node by node, the same number on each")])
        gpus_per_node = ranks // nodes
        if host is not None and gpus_per_node == int(host.value) < per_node_max and \
                (ranks <= per_node_max or ranks % per_node_max == 0):   # whole hosts fill the domains in order
            nodes, gpus_per_node = max(1, ranks // per_node_max), min(ranks, per_node_max)
        if gpus_per_node > per_node_max:
            raise ManifestError([(where, f"the log runs {ranks} ranks on {nodes} host{'s' if nodes > 1 else ''} "
                                  f"({', '.join(launch.hosts)}): {gpus_per_node} GPUs per node, but profile "
                                  f"'{profile.name}' has {per_node_max}; choose a profile of that machine")])
    else:
        nodes = max(1, math.ceil(ranks / per_node_max))
        gpus_per_node = min(ranks, per_node_max)
    if nodes > 1 and profile.network is None:
        raise ManifestError([(_location(log, launch.line if launch else first),
                              f"the log runs {ranks} ranks on {nodes} nodes, but profile '{profile.name}' "
                              "describes one node and no network; choose a scale-out profile "
                              "(chakra-sim profiles lists them)")])
    sizes = []
    for row, line in zip(log.rows, log.line_numbers or (0,) * len(log.rows)):
        if row.in_place != in_place or row.size < min_bytes or (max_bytes is not None and row.size > max_bytes):
            continue
        if row.time_us > 0:   # a time printed as 0 has no error to measure
            sizes.append(Size(row.size, row.time_us, row.dtype, row.redop, row.root, line))
    if not sizes:
        placement = "in-place" if in_place else "out-of-place"
        upper = f" to {max_bytes:,} B" if max_bytes is not None else ""
        raise ManifestError([(log.path, f"no {placement} size from {min_bytes:,} B{upper} with a measured time "
                              "(check --min-bytes, --max-bytes, --in-place)")])
    return Plan(log.path, log.collective, collective, ranks, nodes, gpus_per_node, profile_name, launch,
                in_place, tuple(sizes), log.nccl_version, tuple(algorithms), tuple(protocols))


# --------------------------------------------------------------------------- simulating

def _comm_type(collective: str) -> int:
    from chakra_core import pb

    return {nccl.ALL_REDUCE: pb.ALL_REDUCE, nccl.ALL_GATHER: pb.ALL_GATHER, nccl.REDUCE_SCATTER: pb.REDUCE_SCATTER,
            nccl.ALL_TO_ALL: pb.ALL_TO_ALL, nccl.BROADCAST: pb.BROADCAST, nccl.REDUCE: pb.REDUCE}[collective]


def simulate_plan(plan: Plan, host: PluginHost | None = None, base_dir: Path | None = None) -> list[float]:
    """Each size's simulated time in microseconds: a one-collective trace on every rank, run as
    `chakra-sim run` would (relative profile paths against `base_dir`, default the current folder)."""
    from chakra_core import (
        collective_attrs, int_attr, load, make_plugin_host, pb, simulate, trace_metadata, write_rank_files,
    )

    host = host if host is not None else make_plugin_host()
    comm_type = _comm_type(plan.collective)
    rooted = plan.collective in (nccl.BROADCAST, nccl.REDUCE)
    times = []
    with tempfile.TemporaryDirectory(prefix="chakra-sim-accuracy-") as tmp:
        for index, size in enumerate(plan.sizes):
            node = pb.Node(id=0, name="nccl-tests", type=pb.COMM_COLL_NODE,
                           attr=collective_attrs(comm_type, plan.comm_size(size)))
            if rooted and size.root >= 0:
                node.attr.append(int_attr("root_rank", size.root))
            prefix = Path(tmp) / str(index) / "trace"
            prefix.parent.mkdir()
            write_rank_files(prefix, [[node]] * plan.ranks, trace_metadata({}))
            config = load({"workload": {"trace": str(prefix)}, "system": plan.system()}, host,
                          base_dir=base_dir if base_dir is not None else Path.cwd(), name=plan.log)
            times.append(simulate(config, host, timeline=False).results.finish_ns / 1000)
    return times


def nccl_model(plan: Plan, profile: Profile) -> nccl.NcclModel:
    """NCCL's cost model as the plan's runs used it: their launch, NCCL release and forcing."""
    launch = plan.launch_config
    return nccl.NcclModel(profile, launch["gpus_per_thread"], launch["cuda_graph"], plan.nccl_version,
                          plan.algorithms, plan.protocols)


def nccl_choices(plan: Plan, profile: Profile) -> list[nccl.Choice]:
    """NCCL's algorithm, protocol and channels for each size (chakra_sim_system_nccl.model)."""
    model = nccl_model(plan, profile)
    return [model.time_us(plan.collective, plan.model_bytes(size), plan.ranks, plan.nodes) for size in plan.sizes]


def evaluate(plan: Plan, profile: Profile, host: PluginHost | None = None,
             base_dir: Path | None = None) -> LogResult:
    """Simulate every size of `plan` and compare with the measurements."""
    predicted = simulate_plan(plan, host, base_dir)
    choices = nccl_choices(plan, profile)
    return LogResult(plan, tuple(SizeResult(size, time_us, choice)
                                 for size, time_us, choice in zip(plan.sizes, predicted, choices)))


# --------------------------------------------------------------------------- errors

def band_errors(results: Sequence[SizeResult]) -> dict[str, tuple[float, int]]:
    """Band name -> (geomean error, sizes) for each band of `BANDS` that has sizes."""
    out = {}
    for name, low, high in BANDS:
        errors = [r.log_error for r in results if low <= r.size.nbytes < high]
        if errors:
            out[name] = (geomean_error(errors), len(errors))
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _log_json(result: LogResult) -> dict[str, Any]:
    plan = result.plan
    return {
        "log": plan.log, "collective": plan.test, "ranks": plan.ranks, "nodes": plan.nodes,
        "gpus_per_node": plan.gpus_per_node, "profile": plan.profile,
        "placement": "in-place" if plan.in_place else "out-of-place",
        "launch": plan.launch.as_dict() if plan.launch is not None else None,
        "system": plan.system(),
        "geomean_error": result.geomean_error,
        "bands": {name: {"geomean_error": error, "sizes": count} for name, (error, count) in result.bands.items()},
        "sizes": [{"bytes": r.size.nbytes, "measured_us": r.size.measured_us, "predicted_us": r.predicted_us,
                   "error": r.error, "algorithm": r.choice.algorithm, "protocol": r.choice.protocol,
                   "channels": r.choice.channels, "dtype": r.size.dtype, "redop": r.size.redop,
                   "line": r.size.line}
                  for r in result.sizes],
    }


def report_json(results: Sequence[LogResult]) -> dict[str, Any]:
    """`{"logs": [...], "geomean_error": over every size of every log}`; with one log the top
    level also carries its "sizes". Strict JSON: non-finite numbers become null."""
    logs = [_log_json(result) for result in results]
    out: dict[str, Any] = {"logs": logs,
                           "geomean_error": geomean_error([r.log_error for result in results for r in result.sizes])}
    if len(logs) == 1:
        out["sizes"] = logs[0]["sizes"]
    strict: dict[str, Any] = json.loads(json.dumps(out, default=str), parse_constant=lambda name: None)
    return strict


# --------------------------------------------------------------------------- plotting

def size_label(nbytes: int) -> str:
    """1024 -> "1 KiB", 3 << 20 -> "3 MiB", 12 -> "12 B"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def plot_png(results: Sequence[LogResult], fmt: str = "png") -> bytes:
    """One row per log: time vs size and bus bandwidth vs size (log axes), measured and
    predicted. Bus bandwidth = size / time x nccl-tests' busbw factor (GB/s, 10^9 B/s)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(12, 4.4 * len(results)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    rows = figure.subfigures(len(results), 1, squeeze=False)[:, 0]
    for row, result in zip(rows, results):
        time_axes, bw_axes = row.subplots(1, 2)
        plan = result.plan
        factor = busbw_factor(plan.test, plan.ranks)
        series: dict[tuple[str, str], list[SizeResult]] = {}
        for r in result.sizes:
            series.setdefault((r.size.dtype, r.size.redop), []).append(r)
        for (dtype, redop), points in series.items():
            points = sorted(points, key=lambda r: r.size.nbytes)
            suffix = f" ({dtype})" if len(series) > 1 else ""
            sizes = [r.size.nbytes for r in points]
            measured = [r.size.measured_us for r in points]
            predicted = [r.predicted_us for r in points]
            for axes, as_bw in ((time_axes, False), (bw_axes, True)):
                def convert(n: int, t: float) -> float:
                    return n / (t * 1e3) * factor if as_bw else t   # busbw in GB/s, or time in µs
                axes.plot(sizes, [convert(n, t) for n, t in zip(sizes, measured)], "o-", markersize=3,
                          label=f"measured{suffix}")
                axes.plot(sizes, [convert(n, t) for n, t in zip(sizes, predicted)], "s--", markersize=3,
                          label=f"predicted{suffix}")
        placement = "in-place" if plan.in_place else "out-of-place"
        row.suptitle(f"{plan.test}, {plan.ranks} ranks on {plan.nodes} node{'s' if plan.nodes > 1 else ''}, "
                     f"profile {plan.profile}: {Path(plan.log).name} ({placement}, geomean error "
                     f"{100 * result.geomean_error:.1f}%)", fontsize="medium")
        time_axes.set_title("time per collective", fontsize="medium")
        bw_axes.set_title(f"bus bandwidth = algbw x {factor:.3g}", fontsize="medium")
        for axes, ylabel in ((time_axes, "time (µs)"), (bw_axes, "bus bandwidth (GB/s)")):
            axes.set_xscale("log", base=2)
            axes.set_yscale("log")
            axes.set_xlabel("message size (bytes)")
            axes.set_ylabel(ylabel)
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: size_label(int(value))))
            axes.grid(True, which="major", alpha=0.3)
            axes.legend(loc="best", fontsize="small")
            for label in axes.get_xticklabels():
                label.set_rotation(45)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, metadata={"Software": None} if fmt == "png" else None)
    return buffer.getvalue()
