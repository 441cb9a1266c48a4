"""chakra_sim_system_nccl.nccl_tests: the published logs in plugins/system_nccl/tests/data/nccl-tests parse, with
the right collective, rank count and rows; printed numbers agree with each other; bad input
fails with a `path:line` location."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from chakra_core import ManifestError
from chakra_sim_system_nccl.launch import LaunchInfo
from chakra_sim_system_nccl.nccl_tests import (
    NcclTestsLog, Row, busbw_factor, load, parse, parse_busbw_table, size_from_label,
)
from nccl_logs import result_line, synthetic_log, time_text

DATA = Path(__file__).resolve().parent / "data" / "nccl-tests"

# file -> (collective, ranks, where the rank count came from, rows: sizes x placements)
EXPECTED = {
    "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt": ("all_reduce", 8, "device list", 32 * 2),
    "h100_xxrjun_1node_8gpu_allreduce.txt": ("all_reduce", 8, "device list", 10 * 2),
    "h100_xxrjun_1node_8gpu_allgather.txt": ("all_gather", 8, "device list", 10 * 2),
    "h100_xxrjun_1node_8gpu_reducescatter.txt": ("reduce_scatter", 8, "device list", 10 * 2),
    "h100_xxrjun_1node_8gpu_alltoall.txt": ("alltoall", 8, "device list", 10 * 2),
    "h100_aws-p5_2node_16gpu_allreduce_efa.txt": ("all_reduce", 16, "busbw/algbw", 32 * 2),
    # the 0-byte row is skipped; 64 MiB .. 2 GiB remain
    "h100_aws-p5_2node_16gpu_allreduce_efa_eks-excerpt.txt": ("all_reduce", 16, "busbw/algbw", 6 * 2),
    "a100_aws-p4de_2node_16gpu_allreduce_efa.txt": ("all_reduce", 16, "busbw/algbw", 29 * 2),
}


def data_files() -> list[Path]:
    return sorted(DATA.glob("*.txt"))


def test_every_data_file_is_listed_here():
    assert {path.name for path in data_files()} == set(EXPECTED)


@pytest.mark.parametrize("path", data_files(), ids=lambda path: path.name)
def test_data_file_parses(path: Path):
    collective, ranks, source, n_rows = EXPECTED[path.name]
    log = load(path)
    assert (log.collective, log.ranks, log.ranks_source, len(log.rows)) == (collective, ranks, source, n_rows)
    assert not log.times_from_busbw
    assert all(row.size > 0 and row.time_us > 0 for row in log.rows)
    # both placements, same sizes, sizes increasing
    out_of_place, in_place = log.times(in_place=False), log.times(in_place=True)
    assert list(out_of_place) == list(in_place) == sorted(out_of_place)


@pytest.mark.parametrize("path", data_files(), ids=lambda path: path.name)
def test_printed_numbers_agree(path: Path):
    """The consistency property, computed independently of the parser: algbw = size/time
    (GB = 1e9 B, time in us) and busbw = algbw x factor, within print rounding."""
    log = load(path)
    factor = busbw_factor(log.collective, log.ranks)
    for row in log.rows:
        # time prints with 2, 1 or 0 decimals (%7.2f/%7.1f/%7.0f; newer builds keep 7 characters)
        half_unit = 0.005 if row.time_us < 100 else 0.05 if row.time_us < 10_000 else 0.5
        exact = row.size / (row.time_us * 1e3)
        slack = exact * half_unit / (row.time_us - half_unit) + 0.005 + 1e-6
        assert abs(row.algbw - exact) <= slack, row
        assert abs(row.busbw - row.algbw * factor) <= 0.005 * (1 + factor) + 1e-6, row


def test_dgx_h100_values_match_the_file():
    log = load(DATA / "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt")
    assert log.gpu == "NVIDIA H100 80GB HBM3"
    gib8 = 8 * 2**30
    assert log.times(in_place=False)[gib8] == 31307
    assert log.times(in_place=True)[gib8] == 31328
    assert log.busbws(in_place=False)[gib8] == 480.16
    assert log.algbws(in_place=True)[gib8] == 274.19
    assert log.times(in_place=False)[8] == 13.67
    first = log.rows[0]
    assert first == Row(size=8, count=2, dtype="float", redop="sum", root=-1,
                        time_us=13.67, algbw=0.0, busbw=0.0, in_place=False)
    assert log.line_numbers[0] == 22   # the 8-byte row's line in the file


def test_alltoall_in_place_kept_although_not_validated():
    log = load(DATA / "h100_xxrjun_1node_8gpu_alltoall.txt")   # in-place #wrong prints N/A
    assert log.times(in_place=True)[16 * 2**30] == 43258.6
    assert {row.redop for row in log.rows} == {"none"} and log.dtypes == ("double",)
    assert log.rows[0].count * 8 * 8 == log.rows[0].size   # count is per rank


def test_launcher_prefixes_are_stripped():
    srun = load(DATA / "a100_aws-p4de_2node_16gpu_allreduce_efa.txt")        # "0: "
    assert srun.times(in_place=False)[2 * 2**30] == 51406
    mpirun = load(DATA / "h100_aws-p5_2node_16gpu_allreduce_efa_eks-excerpt.txt")  # "[1,0]<stdout>:"
    assert min(mpirun.times(in_place=False)) == 64 * 2**20   # 0-byte row skipped, "..." ignored
    text = synthetic_log(ranks=4, collective="all_reduce")
    for prefix in ("12: ", "[1,3]<stdout>:", "  [1,0]<stderr>:"):
        prefixed = "\n".join(prefix + line for line in text.splitlines())
        assert parse(prefixed).rows == parse(text).rows


# ----------------------------------------------------------------------------- synthetic logs

@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"])
def test_synthetic_log(collective: str):
    log = parse(synthetic_log(ranks=4, collective=collective), "synthetic.log")
    assert (log.collective, log.ranks, log.gpu) == (collective, 4, "NVIDIA Test GPU")
    assert len(log.rows) == 6   # the size-0 row is dropped
    assert log.times(in_place=False)[1 << 28] == float(time_text(20 + (1 << 28) / 150e3))   # 1809.6
    assert log.times(in_place=True)[1024] == float(time_text((20 + 1024 / 150e3) * 1.01))


def test_ranks_without_device_list():
    gather = parse(synthetic_log(ranks=4, collective="all_gather", with_devices=False))
    assert (gather.ranks, gather.ranks_source) == (4, "size/count")
    reduce_ = parse(synthetic_log(ranks=4, collective="all_reduce", with_devices=False))
    assert (reduce_.ranks, reduce_.ranks_source) == (4, "busbw/algbw")
    broadcast = parse(synthetic_log(ranks=4, collective="broadcast", with_devices=False))
    assert (broadcast.ranks, broadcast.ranks_source) == (None, "")   # busbw = algbw: no clue
    assert parse(synthetic_log(ranks=4, collective="broadcast", with_devices=False), ranks=4).ranks == 4


def test_half_missing_and_time_zero_kept():
    factor = busbw_factor("all_reduce", 4)
    rows = (result_line(1 << 29, (1 << 29) // 4, "float", "sum", -1, factor, [5000.0, None]),
            f"{1 << 30:12d}  {(1 << 30) // 4:12d}     float     sum      -1  {'0.00':>7s}     inf     inf      0")
    log = parse(synthetic_log(ranks=4, collective="all_reduce", extra_rows=rows))
    assert 1 << 29 in log.times(in_place=False) and 1 << 29 not in log.times(in_place=True)
    assert log.times(in_place=False)[1 << 30] == 0.0   # kept as printed
    assert math.isinf(log.algbws(in_place=False)[1 << 30])


def test_collective_from_command_file_name_or_argument(tmp_path: Path):
    body = "\n".join(line for line in synthetic_log(4, "all_gather").splitlines() if "Collective test" not in line)
    with pytest.raises(ManifestError, match="cannot tell which collective"):
        parse(body, "run.log")
    assert parse(body, "run.log", collective="all_gather").collective == "all_gather"
    assert parse(body, "logs/node3_allgather_8B-256M.txt").collective == "all_gather"
    assert parse("$ mpirun -np 4 ./build/all_gather_perf -b 1K -e 256M\n" + body, "run.log").collective == "all_gather"
    with pytest.raises(ManifestError, match="header says all_gather"):
        parse(synthetic_log(4, "all_gather"), collective="all_reduce")


def test_wrong_rank_count_is_caught():
    with pytest.raises(ManifestError, match=r"as 8 ranks \(from argument\) would require; the ratios fit 4 ranks"):
        parse(synthetic_log(ranks=4, collective="all_reduce", with_devices=False), ranks=8)
    with pytest.raises(ManifestError, match="header lists 4 devices"):
        parse(synthetic_log(ranks=4, collective="all_reduce"), ranks=8)


# ----------------------------------------------------------------------------- bad input

def test_truncated_file_names_the_line(tmp_path: Path):
    lines = (DATA / "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt").read_text().splitlines()
    cut = 30   # line 31 is the 4 KiB row; keep its first 60 characters only
    truncated = "\n".join(lines[:cut] + [lines[cut][:60]]) + "\n"
    path = tmp_path / "cut.txt"
    path.write_text(truncated)
    with pytest.raises(ManifestError) as error:
        load(path)
    [(location, reason)] = error.value.problems
    assert location == f"{path}:{cut + 1}" and "columns" in reason


def test_garbage_and_garbled_files(tmp_path: Path):
    with pytest.raises(ManifestError, match="no nccl-tests result rows"):
        parse("Segmentation fault (core dumped)\nsome text\n", "crash.log")
    lines = synthetic_log(4, "all_reduce").splitlines()
    row_at = next(i for i, line in enumerate(lines) if line.split()[:1] == [str(1 << 20)])

    def with_algbw(text: str) -> str:
        tokens = lines[row_at].split()
        tokens[6] = text   # out-of-place algbw
        return "\n".join(lines[:row_at] + ["  ".join(tokens)] + lines[row_at + 1:])

    with pytest.raises(ManifestError, match=rf"garbled\.log:{row_at + 1}: .*not numbers"):
        parse(with_algbw("23.x5"), "garbled.log")
    with pytest.raises(ManifestError, match=rf"mistyped\.log:{row_at + 1}: .*does not match size/time"):
        parse(with_algbw("32.55"), "mistyped.log")


def test_wrong_results_are_refused():
    text = synthetic_log(4, "all_reduce")
    bad = text.replace("      0\n", "      3\n", 1)
    with pytest.raises(ManifestError, match="#wrong = 3"):
        parse(bad)


def test_concatenated_runs_are_refused():
    first, second = synthetic_log(4, "all_reduce"), synthetic_log(4, "all_gather")
    with pytest.raises(ManifestError) as error:
        parse(first + second, "both.log")
    [(location, reason)] = error.value.problems
    start = len(first.splitlines()) + 2   # the second "# Collective test starting:" line
    assert location == f"both.log:{start}" and "second nccl-tests run (all_gather)" in reason
    headless = "\n".join(line for line in (first + first).splitlines() if "Collective test" not in line)
    with pytest.raises(ManifestError, match="second column header"):
        parse(headless, "twice_allreduce.log")


def test_gzip_and_missing_file(tmp_path: Path):
    path = tmp_path / "all_reduce.txt.gz"
    with gzip.open(path, "wt") as stream:
        stream.write(synthetic_log(4, "all_reduce"))
    assert load(path).ranks == 4
    with pytest.raises(ManifestError, match="file not found"):
        load(tmp_path / "absent.txt")


def test_several_data_types_need_a_choice():
    factor = busbw_factor("all_reduce", 4)
    extra = (result_line(1024, 512, "half", "sum", -1, factor, [21.0, 21.0]),)
    log = parse(synthetic_log(4, "all_reduce", extra_rows=extra))
    with pytest.raises(ValueError, match="appears more than once"):
        log.times(in_place=False)
    assert log.times(in_place=False, dtype="half") == {1024: 21.0}


# ----------------------------------------------------------------------------- launch (header)

XXRJUN = LaunchInfo(threads_per_process=1, gpus_per_thread=1, processes=8, hosts=("cnode2-003",),
                    cuda_graph_iters=0, blocking=False, cpu_time=False, line=9)
LAUNCH = {   # file -> what its header says about the launch (None: no `# nThread` line)
    "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt": LaunchInfo(1, 1, 8, ("pool0-01806",), 0, False, False, 7),
    "h100_xxrjun_1node_8gpu_allreduce.txt": XXRJUN,
    "h100_xxrjun_1node_8gpu_allgather.txt": XXRJUN,
    "h100_xxrjun_1node_8gpu_reducescatter.txt": XXRJUN,
    "h100_xxrjun_1node_8gpu_alltoall.txt": XXRJUN,
    "h100_aws-p5_2node_16gpu_allreduce_efa.txt": None,   # the AWS samples print no header
    "h100_aws-p5_2node_16gpu_allreduce_efa_eks-excerpt.txt": None,
    "a100_aws-p4de_2node_16gpu_allreduce_efa.txt": None,
}


@pytest.mark.parametrize("path", data_files(), ids=lambda path: path.name)
def test_launch_of_each_data_file(path: Path):
    launch = load(path).launch
    assert launch == LAUNCH[path.name]
    if launch is not None:
        assert launch.system_launch() == {"gpus_per_thread": 1, "cuda_graph": False}
        assert launch.gpus_per_process == 1 and launch.nodes == 1


def test_dgx_launch_in_detail():
    launch = load(DATA / "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt").launch
    assert launch is not None
    assert (launch.processes, launch.gpus_per_thread, launch.cuda_graph_iters, launch.cuda_graph) == (8, 1, 0, False)


def header_variant(ranks: int = 4, *, header: str | None = None, device: str | None = None,
                   extra: tuple[str, ...] = (), columns: str | None = None, pids=None) -> str:
    """synthetic_log with its `# nThread` line, device lines or column titles replaced."""
    lines = synthetic_log(ranks, "all_reduce").splitlines()
    out = []
    for line in lines:
        if line.startswith("# nThread"):
            out.append(header if header is not None else line)
            out.extend(extra)
            continue
        if line.startswith("#  Rank"):
            rank = int(line.split()[2])
            pid = pids(rank) if pids else 1000 + rank
            if device is not None:
                line = device.format(rank=rank, pid=pid, node=rank // 2)
            else:
                line = line.replace(f"Pid {1000 + rank:6d}", f"Pid {pid:6d}")
        if columns is not None and line.lstrip("#").split()[:2] == ["size", "count"]:
            line = columns
        out.append(line)
    return "\n".join(out) + "\n"


OLD_HEADER = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
              "validation: 1 ")
NEW_HEADER = ("# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
              "agg iters: 1 validation: 1 graph: 10 unalign: 0")


def test_launch_header_versions():
    synthetic = parse(synthetic_log(4, "all_reduce")).launch   # "... iters: 20" (no agg iters, no graph)
    assert synthetic == LaunchInfo(1, 1, 4, ("testhost",), 0, False, False, 3)
    # the oldest format: no Group in the device lines, no agg iters, no graph
    old_device = "#   Rank {rank:2d} Pid {pid:6d} on  oldhost device {rank:2d} [0x1b] Tesla V100"
    old = parse(header_variant(header=OLD_HEADER, device=old_device)).launch
    assert old == LaunchInfo(1, 1, 4, ("oldhost",), 0, False, False, 3)
    # the newest: graph: N unalign: M; one process drives the 4 GPUs (-g 4 -G 10)
    new = parse(header_variant(header=NEW_HEADER, pids=lambda rank: 77)).launch
    assert new is not None and (new.gpus_per_thread, new.processes, new.cuda_graph_iters) == (4, 1, 10)
    assert new.system_launch() == {"gpus_per_thread": 4, "cuda_graph": True}
    # two hosts, two processes each, the same Pids on both: four processes
    two_hosts = parse(header_variant(device=(
        "#  Rank {rank:2d} Group  0 Pid {pid:6d} on node{node} device {rank:2d} [0000:1b:00] NVIDIA H100"),
        pids=lambda rank: 100 + rank % 2)).launch
    assert two_hosts is not None and (two_hosts.hosts, two_hosts.processes) == (("node0", "node1"), 4)
    assert two_hosts.nodes == 2
    # -g 2 on two hosts: one process per host
    two_gpus = parse(header_variant(header=OLD_HEADER.replace("nGpus 1", "nGpus 2"), device=(
        "#  Rank {rank:2d} Group  0 Pid {pid:6d} on node{node} device {rank:2d} [0000:1b:00] NVIDIA H100"),
        pids=lambda rank: 100)).launch
    assert two_gpus is not None and (two_gpus.gpus_per_thread, two_gpus.processes) == (2, 2)


@pytest.mark.parametrize("line", [
    "# Blocking Enabled: wait for completion and barrier after each collective ",
    "# Blocking Enabled: wait and barrier after each inner iteration (-m) ",
    "# Blocking Enabled: wait after each inner iteration (-m), no barrier ",
    "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ",
])
def test_blocking_lines(line: str):
    launch = parse(header_variant(extra=(line, "# Parallel Init Enabled: threads call into NcclInitRank "
                                                "concurrently "))).launch
    assert launch is not None and launch.blocking is True


def test_cut_header_and_cpu_time():
    text = "\n".join(line for line in synthetic_log(4, "all_reduce").splitlines()
                     if not line.startswith(("#  Rank", "# Using devices")))
    launch = parse(text).launch   # the header was cut after the `# nThread` line: no word on -z
    assert launch is not None and (launch.blocking, launch.processes, launch.hosts) == (None, None, None)
    cpu = parse(header_variant(columns="#       size         count      type   redop    root  cputime   algbw   "
                                       "busbw #wrong  cputime   algbw   busbw #wrong")).launch
    assert cpu is not None and cpu.cpu_time
    no_header = "\n".join(line for line in synthetic_log(4, "all_reduce").splitlines() if "nThread" not in line)
    assert parse(no_header).launch is None


def test_contradicting_header_names_the_line():
    # nGpus 4 but one process per rank: the device list shows 4 ranks in 4 processes, 4 x 4 = 16
    text = header_variant(header=NEW_HEADER)
    with pytest.raises(ManifestError) as error:
        parse(text, "contradiction.log")
    [(location, reason)] = error.value.problems
    assert location == "contradiction.log:3" and "nGpus 4 x 4 = 16" in reason and "contradicts" in reason
    # a second, different `# nThread` line
    lines = synthetic_log(4, "all_reduce").splitlines()
    lines.insert(3, NEW_HEADER)
    with pytest.raises(ManifestError, match=r"twice\.log:4: a second '# nThread' header line"):
        parse("\n".join(lines), "twice.log")


# ----------------------------------------------------------------------------- busbw tables

@pytest.mark.parametrize("label, size", [("1K", 1024), ("32K", 32768), ("65K", 65536), ("132K", 131072),
                                         ("256K", 262144), ("524K", 524288), ("1M", 1 << 20),
                                         ("33M", 1 << 25), ("67M", 1 << 26), ("134M", 1 << 27),
                                         ("268M", 1 << 28), ("536M", 1 << 29), ("1G", 1 << 30),
                                         ("8G", 1 << 33), ("4096", 4096)])
def test_size_labels(label: str, size: int):
    assert size_from_label(label) == size


def test_size_label_not_a_power_of_two():
    with pytest.raises(ValueError):
        size_from_label("100K")


@pytest.mark.parametrize("collective, ranks", [("all_reduce", 8), ("all_gather", 16), ("alltoall", 8)])
def test_busbw_table_round_trip(collective: str, ranks: int):
    """time -> busbw (printed with 2 decimals) -> time, within that print rounding."""
    labels = {"1K": 1 << 10, "65K": 1 << 16, "132K": 1 << 17, "33M": 1 << 25, "1G": 1 << 30, "8G": 1 << 33}
    factor = busbw_factor(collective, ranks)
    times = {size: 15.0 + size / 300e3 for size in labels.values()}   # 15 us + 300 GB/s
    table = ["# source: synthetic", "| Message Size (Bytes) | Test VM (GB/s) |", "| --- | --- |"]
    table += [f"| {label} | {size / (times[size] * 1e3) * factor:.2f} |  " for label, size in labels.items()]
    log = parse_busbw_table("\n".join(table), collective, ranks, path="table.md")
    assert isinstance(log, NcclTestsLog) and log.times_from_busbw and log.ranks == ranks
    assert log.times(in_place=False) == {}
    for size, time_us in log.times(in_place=True).items():
        busbw = size / (times[size] * 1e3) * factor
        assert time_us == pytest.approx(times[size], rel=0.005 / busbw + 1e-9)
    assert log.line_numbers[0] == 4


def test_busbw_table_errors(tmp_path: Path):
    with pytest.raises(ManifestError, match=r"t\.md:3: .*not \(a rounding of\) a power of two"):
        parse_busbw_table("| size | GB/s |\n|---|---|\n| 100K | 1.0 |\n", "all_reduce", 8, path="t.md")
    with pytest.raises(ManifestError, match=r"t\.md:2: busbw is not a number"):
        parse_busbw_table("| size | GB/s |\n| 1K | n/a |\n", "all_reduce", 8, path="t.md")
    path = tmp_path / "vm_allreduce_busbw-table.txt"
    path.write_text("# notes\n| size | GB/s |\n| 1K | 0.07 |\n")
    with pytest.raises(ManifestError, match="give collective= and ranks="):
        load(path)
    assert load(path, ranks=8).times(in_place=True)[1024] == pytest.approx(1024 / (0.07 / 1.75 * 1e3))
