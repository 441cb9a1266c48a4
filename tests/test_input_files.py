"""Issue 33's hardening, cause by cause: the one bounded reader of user files (chakra_core/input_files.py),
numbers past 64 bits, rank files that are not files, outputs that cannot be written, rank counts
past the limit, partial and stale rank files. End to end through the CLI where a user meets them."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import stat
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from click.testing import CliRunner, Result

from chakra_core.cli import main
from chakra_core.errors import ChakraSimError, InputFileError, ManifestError, TraceFormatError
from chakra_core.et.build import int_attr, write_rank_files
from chakra_core.et.io import encode_message, encode_varint, iter_trace, read_trace
from chakra_core.input_files import check_input, read_input_bytes, read_input_text
from chakra_core.limits import INPUT_BYTES
from chakra_core.schema import pb
from chakra_core.tools.generate import microbenchmark as microbenchmark_module
from chakra_core.tools.pytorch.errors import ConversionError
from chakra_core.tools.pytorch.jsonfile import load_json
from tests.fuzz_files import write_job, write_prefix_with

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"
read_only_dirs_restrict = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 folder")


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result: Result, *names: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.strip().count("\n") <= 2, result.output
    for name in names:
        assert name in result.output, result.output


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A FIFO opened for reading would block the test forever: fail it after 10 s instead."""
    def hang(signum: int, frame: object) -> None:
        raise TimeoutError("blocked: a FIFO was opened")
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# 1. Unbounded reads ----------------------------------------------------------------------------
def test_special_files_are_refused_from_their_stat_before_being_opened(tmp_path: Path, no_hang: None) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    sock = tmp_path / "in.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock))
    dangling = tmp_path / "in.link"
    dangling.symlink_to(tmp_path / "nowhere")
    expected = {fifo: "a named pipe", sock: "a socket", tmp_path: "a directory",
                Path("/dev/zero"): "a character device", dangling: "a dangling symbolic link", tmp_path / "missing": "file not found"}
    for path, reason in expected.items():
        for read in (check_input, lambda p: read_input_text(p), lambda p: read_trace(p)):
            with pytest.raises((InputFileError, TraceFormatError), match=reason) as caught:
                read(path)
            assert str(path) in str(caught.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)   # nobody opened it: no writer needed


def test_a_file_over_its_limit_is_refused_naming_its_size_and_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "big.yaml"
    config.write_text("a: " + "x" * 200 + "\n")
    monkeypatch.setenv(INPUT_BYTES.env, "100")
    with pytest.raises(InputFileError, match=r"big.yaml: the file is 204 bytes, too large to read; the limit is "
                                             r"100 bytes \(CHAKRA_SIM_MAX_INPUT_BYTES"):
        read_input_bytes(config, INPUT_BYTES)
    one_line_error(cli("validate", str(config)), "big.yaml", "204 bytes", "CHAKRA_SIM_MAX_INPUT_BYTES")
    monkeypatch.setenv(INPUT_BYTES.env, "1000")
    assert read_input_text(config).startswith("a: x")


def test_json_traces_have_their_own_limit_compressed_or_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "host.json"
    plain.write_text('{"nodes": [' + ", ".join(["{}"] * 500) + "]}")
    packed = tmp_path / "host.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    monkeypatch.setenv("CHAKRA_SIM_MAX_JSON_TRACE_BYTES", "1000")
    for path in (plain, packed):
        with pytest.raises(ConversionError, match=f"{path.name}: .*CHAKRA_SIM_MAX_JSON_TRACE_BYTES"):
            load_json(path, "PyTorch execution trace")
    monkeypatch.setenv("CHAKRA_SIM_MAX_JSON_TRACE_BYTES", "10000")
    assert len(load_json(packed, "PyTorch execution trace")["nodes"]) == 500


def test_a_length_prefix_beyond_the_file_is_an_error_not_an_allocation(tmp_path: Path) -> None:
    """60 MiB announced (under the 64 MiB message limit) in a 30-byte file: read as far as the file goes."""
    trace = tmp_path / "t.et"
    trace.write_bytes(encode_message(pb.GlobalMetadata(version="0.0.4")) + encode_varint(60 << 20) + b"\x08\x01")
    tracemalloc.start()
    try:
        for read in (read_trace, lambda p: list(iter_trace(p)[1])):
            with pytest.raises(TraceFormatError, match="runs past the end of the file"):
                read(trace)
        result = cli("validate", str(trace))   # not a manifest: read as YAML, refused
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes allocated"
    assert result.exit_code == 2


# 2. Numbers past 64 bits -----------------------------------------------------------------------
def test_a_job_too_large_for_a_trace_names_the_key_and_the_value(tmp_path: Path) -> None:
    job = write_job(tmp_path, seq=10**9)
    for args in (["validate", str(job)], ["run", str(job), "--out", str(tmp_path / "out")],
                 ["generate", "job", str(job), "--output", str(tmp_path / "out" / "t")]):
        result = cli(*args)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "job.training.seq: 1000000000: a layer's" in result.output and "2^63-1" in result.output
    assert not (tmp_path / "out").exists()


def test_generator_options_past_64_bits_name_the_option(tmp_path: Path) -> None:
    out = str(tmp_path / "out" / "t")
    one_line_error(cli("generate", "microbenchmark", "--collective", "all_reduce", "--size", str(2**70), "--npus",
                       "8", "--output", out), f"--size {2**70}", "2^63-1")
    result = cli("generate", "transformer", "--layers", "2", "--hidden", "1024", "--heads", "16", "--seq",
                 str(10**12), "--batch", "8", "--vocab", "50304", "--output", out)
    assert result.exit_code == 2 and f"--seq {10**12}: a layer's" in result.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(ChakraSimError, match="attribute comm_size = 1,180,591,620,717,411,303,424"):
        int_attr("comm_size", 2**70)
    assert int_attr("comm_size", 2**63 - 1).int64_val == 2**63 - 1


# 3. Files that are not files -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["directory", "dangling-symlink"])
def test_a_rank_file_that_is_not_a_file_is_named_and_nothing_is_written(tmp_path: Path, kind: str) -> None:
    prefix = write_prefix_with(tmp_path, kind)
    out = tmp_path / "out"
    for args in (["jsonize", str(prefix), "--out", str(out)], ["analyze", str(prefix)],
                 ["obfuscate", str(prefix), "--out", str(out / "o")],
                 ["synthesize", "--from", str(prefix), "--ranks", "2", "--out", str(out / "s")]):
        result = cli(*args)
        one_line_error(result, "ar.5.et")
        assert "cannot write" not in result.output      # the input is blamed, not the output
        assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


def test_outputs_that_cannot_be_written_are_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    traces = ROOT / "examples" / "traces" / "all_reduce_8npus_1MB" / "all_reduce"
    one_line_error(cli("jsonize", str(traces), "--out", str(blocker / "json")), "cannot write", "a-file")
    one_line_error(cli("generate", "job", str(ROOT / "examples" / "llama3-70b-64gpu.yaml"), "--save-job",
                       str(blocker / "job.yaml")), "cannot write", "a-file")


@read_only_dirs_restrict
def test_a_read_only_folder_is_a_one_line_error_with_nothing_half_written(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        traces = ROOT / "examples" / "traces" / "all_reduce_8npus_1MB" / "all_reduce"
        one_line_error(cli("jsonize", str(traces), "--out", str(locked)), "cannot write", "Permission denied")
        one_line_error(cli("generate", "job", str(ROOT / "examples" / "llama3-70b-64gpu.yaml"), "--save-job",
                           str(locked / "job.yaml")), "cannot write", "locked")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


# 4. Scale bounds and partial outputs -----------------------------------------------------------
def test_rank_counts_past_the_limit_are_refused_before_any_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    result = cli("generate", "microbenchmark", "--collective", "all_reduce", "--size", "64", "--npus", "1000000",
                 "--output", str(out / "t"))
    one_line_error(result, "--npus 1,000,000", "131,072", "CHAKRA_SIM_MAX_RANKS")
    traces = ROOT / "examples" / "traces" / "all_reduce_8npus_1MB" / "all_reduce"
    one_line_error(cli("synthesize", "--from", str(traces), "--ranks", "1000000", "--out", str(out / "s")),
                   "--ranks 1,000,000", "CHAKRA_SIM_MAX_RANKS")
    assert not out.exists()
    monkeypatch.setenv("CHAKRA_SIM_MAX_RANKS", "4")
    one_line_error(cli("generate", "microbenchmark", "--collective", "all_reduce", "--size", "64", "--npus", "8",
                       "--output", str(out / "t")), "--npus 8")
    monkeypatch.setenv("CHAKRA_SIM_MAX_RANKS", "8")
    assert cli("generate", "microbenchmark", "--collective", "all_reduce", "--size", "64", "--npus", "8",
               "--output", str(out / "t")).exit_code == 0


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_an_interrupted_generation_leaves_the_previous_files_and_no_partial_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]) -> None:
    prefix = tmp_path / "t"
    write_rank_files(prefix, [[pb.Node(id=1, name="old")]] * 2, pb.GlobalMetadata(version="0.0.4"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = microbenchmark_module.write_rank_files.__globals__["write_trace"]
    calls = []

    def failing(path: Path, *args: object, **kwargs: object) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise failure(28, "No space left on device")
        real(path, *args, **kwargs)

    monkeypatch.setitem(microbenchmark_module.write_rank_files.__globals__, "write_trace", failing)
    with pytest.raises(failure):
        microbenchmark_module.write_microbenchmark(prefix, "all_reduce", 64, 8)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# 5. Stale rank files ---------------------------------------------------------------------------
def test_fewer_ranks_under_a_prefix_remove_the_stale_ones(tmp_path: Path) -> None:
    prefix = tmp_path / "traces" / "t"
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.9.et.gz").write_bytes(b"")    # an older compressed rank
    (tmp_path / "traces" / "t.notes.et").write_text("kept")  # not a rank file
    for npus in ("8", "4"):
        assert cli("generate", "microbenchmark", "--collective", "all_reduce", "--size", "64", "--npus", npus,
                   "--output", str(prefix)).exit_code == 0
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["t.0.et", "t.1.et", "t.2.et", "t.3.et", "t.notes.et"]
    assert cli("analyze", str(prefix)).exit_code == 0
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["workload"]["trace"] = str(prefix)
    manifest["network"]["npus_count"] = [4]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(manifest))
    result = cli("validate", str(tmp_path / "m.yaml"))
    assert result.exit_code == 0 and "valid (4 rank(s)" in result.output, result.output


def test_a_failed_configuration_read_is_a_manifest_error_naming_the_file(tmp_path: Path) -> None:
    from chakra_core.config.files import read_config_file

    with pytest.raises(ManifestError, match=r"nope.yaml: file not found"):
        read_config_file(tmp_path / "nope.yaml")


def test_a_microbenchmark_too_large_to_build_is_refused_before_any_node(tmp_path):
    from click.testing import CliRunner

    from chakra_core.cli import main

    for args in (["--collective", "all_reduce", "--size", "1024", "--npus", "8", "--iterations", "1000000000"],
                 ["--collective", "send_recv", "--pattern", "all-pairs", "--size", "1024", "--npus", "100000"]):
        result = CliRunner().invoke(main, ["generate", "microbenchmark", *args, "--output", str(tmp_path / "t")])
        assert result.exit_code == 2, result.output
        assert "nodes to build in memory" in result.output and "CHAKRA_SIM_MAX_GENERATED_NODES" in result.output
    assert list(tmp_path.iterdir()) == []
