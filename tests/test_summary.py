"""The terminal summary: units by magnitude, one row per rank up to 64, statistics above."""

from __future__ import annotations

from rich.console import Console

from chakra_core.report.summary import MAX_ROWS, format_time, print_summary, rank_table, time_unit
from tests.simhelpers import results_of


def _results(finishes: list[int], warnings: tuple[str, ...] = ()):
    ranks = [{"rank": r, "finish_ns": f, "gpu_compute_ns": f // 2, "cpu_compute_ns": 0, "memory_ns": 0,
              "exposed_network_ns": f - f // 2 - f // 8, "waiting_ns": f // 8, "idle_ns": 0,
              "bytes_sent": 1 << 20, "bytes_received": 1 << 20} for r, f in enumerate(finishes)]
    return results_of(ranks, warnings=warnings)


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_the_unit_follows_the_magnitude():
    assert [time_unit(ns)[0] for ns in (0, 9_999, 10_000, 64_440, 9_999_999, 10**7, 913_537_872, 12 * 10**9)] \
        == ["ns", "ns", "µs", "µs", "µs", "ms", "ms", "s"]
    assert format_time(64_440) == "64.440 µs" and format_time(999) == "999 ns"
    assert format_time(913_537_872) == "913.538 ms"


def test_one_row_per_rank_with_the_columns_that_are_not_all_zero():
    text = _text(rank_table(_results([64_440] * 8)))
    assert "finish (µs)" in text and "GPU compute" in text and "waiting for peers" in text
    assert "CPU compute" not in text and "idle" not in text      # zero on every rank
    assert text.count("64.440") == 8
    assert "time columns sum to finish" in text


def test_above_16_distinct_rows_min_median_max_and_the_slowest_rank():
    finishes = [1_000_000 + 1000 * r for r in range(MAX_ROWS + 2)]
    finishes[17] = 5_000_000
    text = _text(rank_table(_results(finishes)))
    lines = [line for line in text.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in lines] == ["min", "median", "max", "slowest: 17"]
    assert "5,000.000" in lines[2] and "5,000.000" in lines[3] and "1,000.000" in lines[0]   # µs


def test_the_finish_line_and_warnings():
    console = Console(width=200, record=True)
    print_summary(_results([913_537_872], warnings=("something to know",)), console, wall_s=1.5)
    text = console.export_text()
    assert "finish: 913.538 ms (913,537,872 ns) on 1 rank(s)" in text
    assert "1 warning(s)" in text and "something to know" in text


def test_ranks_with_identical_figures_share_a_row_unless_every_rank_is_asked_for():
    finishes = [1_000_000] * 16 + [2_000_000] * 16 + [3_000_000] * 16
    text = _text(rank_table(_results(finishes)))
    labels = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert labels == ["0-15 (16)", "16-31 (16)", "32-47 (16)"]
    assert "ranks with identical figures share a row" in text
    every = _text(rank_table(_results(finishes), show_all=True))
    assert len([line for line in every.splitlines() if line.startswith("│")]) == 48


def test_a_training_step_is_one_headline_and_a_table_of_its_parts(tmp_path):
    from click.testing import CliRunner

    from chakra_core.cli import main
    from tests.test_plan import manifest as job_manifest
    import yaml

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**job_manifest(gpus=8), "output": {"dir": str(tmp_path / "out")}}))
    result = CliRunner().invoke(main, ["run", str(job), "--plots"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    headline = next(line for line in result.output.splitlines() if line.startswith("training step:"))
    assert "GPUs —" in headline and "TFLOP/s per GPU" in headline and "tokens/s per GPU" in headline
    assert "the parts sum to the step" in result.output
    assert (tmp_path / "out" / "step.png").stat().st_size > 0 and (tmp_path / "out" / "breakdown.png").exists()
