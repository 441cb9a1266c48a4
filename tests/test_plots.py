"""PNG plots: `chakra-sim run --plots` (breakdown.png) and the analysis plots of chakra_core.report.plots."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from chakra_core._atomic import AtomicFiles
from chakra_core.cli import main
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.report import analysis_plots, plots
from chakra_core.report.compare import compare_results
from chakra_core.schema import pb
from chakra_core.testing import collective, comp, write_ranks
from chakra_core.tools.analyze import analyze_traces
from tests.simhelpers import results_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_png(data: bytes):
    """The image matplotlib reads back from PNG bytes (rows, columns, channels)."""
    from matplotlib.image import imread

    assert data.startswith(PNG_MAGIC)
    return imread(io.BytesIO(data), format="png")


def _results(ranks: int) -> dict:
    """A results document whose ranks differ (a finish and a breakdown that add up)."""
    rows = []
    for rank in range(ranks):
        times = {key: 0 for key in BREAKDOWN}
        times.update(gpu_compute_ns=1_000_000 + 1000 * rank, waiting_ns=5000 * (rank % 7),
                     exposed_network_ns=200_000, cpu_compute_ns=3000 * (rank % 3))
        rows.append({"rank": rank, "finish_ns": sum(times.values()), **times})
    return results_of(rows)


def test_run_plots_writes_a_readable_breakdown_png_and_a_rerun_without_removes_it(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(EXAMPLE), "--out", str(tmp_path), "--plots", "-q"])
    assert result.exit_code == 0, result.output
    png = (tmp_path / "breakdown.png").read_bytes()
    image = read_png(png)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 600
    assert "breakdown.png" in json.loads((tmp_path / ".chakra-sim-outputs.json").read_text())["files"]

    assert runner.invoke(main, ["run", str(EXAMPLE), "--out", str(tmp_path), "--plots", "-q"]).exit_code == 0
    assert (tmp_path / "breakdown.png").read_bytes() == png          # deterministic

    assert runner.invoke(main, ["run", str(EXAMPLE), "--out", str(tmp_path), "-q"]).exit_code == 0
    assert not (tmp_path / "breakdown.png").exists()
    assert (tmp_path / "results.json").exists()


@pytest.mark.parametrize("ranks", [1, 8, 1024])
def test_breakdown_png_draws_one_to_a_thousand_ranks(ranks):
    png = plots.breakdown_png(_results(ranks))
    assert read_png(png).shape[1] >= 600
    assert plots.breakdown_png(_results(ranks)) == png


def test_breakdown_png_of_ranks_that_did_nothing():
    rows = [{"rank": 0, "finish_ns": 0, **{key: 0 for key in BREAKDOWN}}]
    read_png(plots.breakdown_png(results_of(rows)))


def test_atomic_files_stage_bytes_with_text(tmp_path):
    with AtomicFiles() as staged:
        staged.write_text(tmp_path / "a.txt", "text")
        staged.write_bytes(tmp_path / "b.png", PNG_MAGIC)
        assert not (tmp_path / "b.png").exists()      # nothing is in place before commit
        staged.commit()
    assert (tmp_path / "a.txt").read_text() == "text" and (tmp_path / "b.png").read_bytes() == PNG_MAGIC


def _imbalanced_report(tmp_path) -> dict:
    ranks = []
    for rank in range(4):
        nodes, previous = [], []
        for k in range(12):
            size = (1 << 20) * (2 if rank == 2 and k % 4 == 1 else 1)
            if rank == 3 and k == 6:
                size = 0
            nodes.append(comp(2 * k, 10 + rank, deps=previous))
            nodes.append(collective(2 * k + 1, pb.ALL_REDUCE, size, deps=[2 * k]))
            previous = [2 * k]
        ranks.append(nodes)
    return analyze_traces(write_ranks(tmp_path, ranks))


def test_analysis_plots_are_valid_and_deterministic(tmp_path):
    report = _imbalanced_report(tmp_path)
    assert len(report.imbalance.flagged) == 4       # three doubled, one zero
    for draw in (analysis_plots.message_sizes_png, analysis_plots.imbalance_png, analysis_plots.compute_vs_comm_png):
        png = draw(report)
        read_png(png)
        assert draw(report) == png, draw.__name__


def test_analysis_plots_of_a_trace_without_communication(tmp_path):
    report = analyze_traces(write_ranks(tmp_path, [[comp(0, 5)]] * 2))
    for draw in (analysis_plots.message_sizes_png, analysis_plots.imbalance_png, analysis_plots.compute_vs_comm_png):
        read_png(draw(report))


def test_compare_png(tmp_path):
    a = _results(40).ranks
    b = tuple(dataclasses.replace(row, finish_ns=row.finish_ns + 10_000,
                                  breakdown={**row.breakdown, "waiting_ns": row.breakdown["waiting_ns"] + 10_000})
              for row in a)
    png = plots.compare_png(compare_results(a, b, "a/results.json", "b/results.json"))
    assert read_png(png).shape[1] > 1000


def test_readable_units():
    assert plots.readable_unit([999, 12_000], "ns") == (1e3, "µs")
    assert plots.readable_unit([3 << 30], "bytes") == (float(1 << 30), "GiB")
    assert plots.readable_unit([5], "ops") == (1.0, "ops")
    assert [plots.size_text(size) for size in (0, 512, 4096, 1 << 20)] == ["0 B", "512 B", "4 KiB", "1 MiB"]


def _groups_report(tmp_path, groups: int):
    """`groups` communicator groups of 2 ranks, each with three equally balanced all-reduces."""
    ranks = [[collective(k, pb.ALL_REDUCE, 1 << 20, pg_name=f"g{rank // 2}") for k in range(3)]
             for rank in range(2 * groups)]
    return analyze_traces(write_ranks(tmp_path, ranks),
                          comm_groups={f"g{g}": [2 * g, 2 * g + 1] for g in range(groups)})


def test_imbalance_groups_get_distinct_styles_and_do_not_overlap(tmp_path):
    figure = analysis_plots.imbalance_figure(_groups_report(tmp_path, 14))
    lines = [line for line in figure.axes[0].get_lines() if line.get_label().endswith("(2 ranks)")]
    assert len(lines) == 14
    looks = {(tuple(line.get_color()), line.get_marker(), line.get_linestyle()) for line in lines}
    assert len(looks) == 14 and len({tuple(line.get_color()) for line in lines}) == 14   # tab20, not C0-C9 again
    # equal ratios: the groups' points sit side by side around each collective #, not on one spot
    assert len({line.get_xdata()[0] for line in lines}) == 14


def test_message_size_axis_and_colour_bar_stay_readable_at_64_ranks(tmp_path):
    ranks = [[collective(k, pb.ALL_REDUCE, 1 << (k + (rank % 3)), pg_name="0") for k in range(30)]
             + [collective(30 + j, pb.ALL_REDUCE, 1 << 10, pg_name="0") for j in range(rank * 40)]
             for rank in range(64)]
    report = analyze_traces(write_ranks(tmp_path, ranks), comm_groups={"0": list(range(64))})
    figure = analysis_plots.message_sizes_figure(report)
    axes, colour_bar = figure.axes
    figure.canvas.draw()
    sizes = [tick.get_text() for tick in axes.get_xticklabels()]
    assert 1 < len(sizes) <= analysis_plots.MAX_SIZE_TICKS
    assert sizes[0] == "1 B" and all(text.split()[-1] in ("B", "KiB", "MiB", "GiB") for text in sizes)
    counts = [tick.get_text() for tick in colour_bar.get_yticklabels() if tick.get_text()]
    assert 1 < len(counts) <= analysis_plots.MAX_COLOURBAR_TICKS
    assert "1k" in counts and not any("^" in text or "e+" in text for text in counts)


def test_count_text():
    assert [analysis_plots.count_text(v) for v in (1, 950, 12_000, 1_500_000)] == ["1", "950", "12k", "1.5M"]
