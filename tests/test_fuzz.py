"""Malformed inputs, fed to every command that reads user files (corpus: tests/fuzz_inputs.py).

Every input gets one clear answer: success, or `error:` naming the file (and where) with exit
status 2 — no traceback, no hang, nothing half-written in the output folder, and for the inputs
of tests/fuzz_files.py no run killed by its 2 GiB memory limit — and `validate`
rejects exactly what `run` rejects. Property tests (hypothesis) check that the readers of a
.et file (in-memory, streaming index, jsonizer, folding) agree on arbitrary bytes, and that
the configuration reader answers any text with a mapping or a ManifestError. The limits of
chakra_core/limits.py are checked to say what they are and how to raise them.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_core.config.files import read_config_file
from chakra_core.errors import ChakraSimError, ManifestError, SimulationError, TraceFormatError, TraceGraphError
from chakra_core.et.io import encode_message, encode_varint, iter_trace, read_trace
from chakra_core.et.jsonize import jsonize_file
from chakra_core.feeder import InMemoryFeeder, StreamingFeeder
from chakra_core.schema import pb
from chakra_core.testing import make_node
from tests.fuzz_inputs import (ALIAS_BOMB, EXAMPLE_TRACES, Case, Outcome, all_cases, judge,
                               trace_mutations, _write_manifest, _write_prefix)

CASES = all_cases(full=False)
KNOWN_DISAGREEMENTS: dict[str, str] = {}
"""Inputs on which validate and run still disagree (name -> why), run as strict expected failures."""
AGREEING = [pytest.param(c, id=c.id, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DISAGREEMENTS[c.name]))
            if c.name in KNOWN_DISAGREEMENTS else c
            for c in CASES if c.trace and c.command == "run"]
OTHERS = [c for c in CASES if not c.trace]


def _check(outcome: Outcome) -> None:
    assert outcome.verdict in ("ok", "error"), f"{outcome.case.id}: {outcome.verdict}\n{outcome.output[-3000:]}"


@pytest.mark.parametrize("case", OTHERS, ids=lambda c: c.id)
def test_every_command_answers_a_malformed_input_clearly(case: Case, tmp_path: Path) -> None:
    _check(judge(case, tmp_path))


@pytest.mark.parametrize("case", AGREEING, ids=lambda c: c.id)
def test_validate_rejects_exactly_what_run_rejects(case: Case, tmp_path: Path) -> None:
    """Both answer clearly, and validate's verdict is run's (the same inputs, two folders)."""
    ran = judge(case, tmp_path / "run")
    validated = judge(Case("validate", case.name, case.build, case.names, trace=True), tmp_path / "validate")
    _check(ran)
    _check(validated)
    assert ran.rejected == validated.rejected, (
        f"{case.name}: run {'rejects' if ran.rejected else 'accepts'}, validate "
        f"{'rejects' if validated.rejected else 'accepts'}\nrun: {ran.output[-1500:]}\n"
        f"validate: {validated.output[-1500:]}")


def test_a_device_as_a_trace_is_refused_at_once_in_a_subprocess(tmp_path: Path) -> None:
    """/dev/zero never ends: it read until memory ran out; now refused before the first byte."""
    _write_prefix(tmp_path, Path("/dev/zero"))
    manifest = _write_manifest(tmp_path)
    for command in ("run", "validate", "analyze"):
        target = str(manifest) if command != "analyze" else str(tmp_path / "traces" / "t")
        proc = subprocess.run([sys.executable, "-m", "chakra_core.cli", command, target, "--out",
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "t.0.et" in proc.stderr and "not a regular file" in proc.stderr
        assert "Traceback" not in proc.stderr


# Readers agree ----------------------------------------------------------------------------
def _verdicts(path: Path) -> dict[str, str]:
    """What each reader says of a file: 'ok' or the class of the ChakraSimError it raised."""
    out = {}

    def attempt(name: str, read) -> None:   # type: ignore[no-untyped-def]
        try:
            read()
            out[name] = "ok"
        except (TraceFormatError, TraceGraphError) as exc:
            out[name] = type(exc).__name__

    attempt("memory", lambda: InMemoryFeeder.from_file(path))
    attempt("streaming", lambda: StreamingFeeder(path).close())
    return out


def _frames_agree(path: Path, out: Path) -> None:
    """read_trace, iter_trace and the jsonizer accept the same files and read the same nodes."""
    results = []
    for read in (lambda: [n.SerializeToString() for n in read_trace(path).nodes],
                 lambda: [n.SerializeToString() for _, n in iter_trace(path)[1]],
                 lambda: jsonize_file(path, out)):
        try:
            results.append(("ok", read()))
        except TraceFormatError:
            results.append(("error", None))
    assert [r[0] for r in results] == [results[0][0]] * 3, results
    if results[0][0] == "ok":
        assert results[0][1] == results[1][1] and results[2][1] == len(results[0][1])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_every_reader_gives_arbitrary_bytes_the_same_verdict(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "x.et"
    path.write_bytes(data)
    _frames_agree(path, tmp_path / "x.json")
    verdicts = _verdicts(path)
    assert verdicts["memory"] == verdicts["streaming"], verdicts


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(padding=st.lists(st.integers(0, 9), min_size=4, max_size=4), parents=st.lists(st.integers(0, 3), max_size=6))
def test_non_minimal_length_prefixes_read_the_same_everywhere(padding: list[int], parents: list[int],
                                                              tmp_path: Path) -> None:
    """Protobuf's rule: a prefix of up to 10 bytes, padded with 0x80 continuation bytes, reads as
    its value. Every reader (and the streaming index's offsets into the file) follow it."""
    meta = pb.GlobalMetadata(version="0.0.4")
    nodes = [make_node(i, pb.COMP_NODE, [p for p in parents if p < i], duration_micros=i + 1) for i in range(4)]
    blob = bytearray(encode_message(meta))
    for node, pad in zip(nodes, padding):
        body = node.SerializeToString()
        prefix = bytearray(encode_varint(len(body)))
        pad = min(pad, 10 - len(prefix))
        if pad:
            prefix[-1] |= 0x80
            prefix += b"\x80" * (pad - 1) + b"\x00"
        blob += prefix + body
    path = tmp_path / "p.et"
    path.write_bytes(bytes(blob))
    _frames_agree(path, tmp_path / "p.json")
    streaming = StreamingFeeder(path)
    try:
        for node in nodes:   # bodies read back from the offsets the index recorded
            assert streaming.lookup_node(node.id).pb == node
    finally:
        streaming.close()
    assert _verdicts(path) == {"memory": "ok", "streaming": "ok"}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet="ab:{}[]-&*! \n\t'\"#.,0123456789", max_size=120))
def test_the_config_reader_answers_any_text_with_a_mapping_or_a_manifest_error(text: str, tmp_path: Path) -> None:
    for suffix in (".yaml", ".json"):
        path = tmp_path / f"c{suffix}"
        path.write_text(text)
        try:
            assert isinstance(read_config_file(path), dict)
        except ManifestError as exc:
            assert str(path) in str(exc)


# Limits -------------------------------------------------------------------------------------
def test_each_trace_limit_names_its_variable_and_can_be_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = EXAMPLE_TRACES / "all_reduce.0.et"
    monkeypatch.setenv("CHAKRA_SIM_MAX_MESSAGE_BYTES", "20")
    with pytest.raises(TraceFormatError, match="CHAKRA_SIM_MAX_MESSAGE_BYTES") as caught:
        read_trace(good)
    assert caught.value.offset == 8      # the node's frame, after the 8-byte metadata frame
    monkeypatch.setenv("CHAKRA_SIM_MAX_MESSAGE_BYTES", "1000")
    assert len(read_trace(good).nodes) == 1

    hub = tmp_path / "hub.et"
    nodes = [make_node(i, pb.COMP_NODE) for i in range(5)] + [make_node(9, pb.COMP_NODE, range(5))]
    hub.write_bytes(encode_message(pb.GlobalMetadata()) + b"".join(encode_message(n) for n in nodes))
    monkeypatch.setenv("CHAKRA_SIM_MAX_NODE_PARENTS", "4")
    for read in (InMemoryFeeder.from_file, StreamingFeeder):
        with pytest.raises(TraceGraphError, match=r"hub.et: node 9 .* lists 5 parents.*CHAKRA_SIM_MAX_NODE_PARENTS"):
            read(hub)
    monkeypatch.setenv("CHAKRA_SIM_MAX_NODE_PARENTS", "5")
    assert InMemoryFeeder.from_file(hub).num_nodes == 6

    monkeypatch.setenv("CHAKRA_SIM_MAX_MESSAGE_BYTES", "not a number")
    with pytest.raises(ChakraSimError, match="CHAKRA_SIM_MAX_MESSAGE_BYTES='not a number'"):
        read_trace(good)


def test_a_gzip_bomb_stops_early_and_the_ratio_can_be_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = tmp_path / "bomb.et"
    bomb.write_bytes(gzip.compress(bytes(256 << 10), mtime=0))   # 256 KiB of zeros in 300 bytes
    for read in (read_trace, lambda p: list(iter_trace(p)[1]), StreamingFeeder):
        with pytest.raises(TraceFormatError, match="gzip bomb.*CHAKRA_SIM_MAX_GZIP_RATIO"):
            read(bomb)
    monkeypatch.setenv("CHAKRA_SIM_MAX_GZIP_RATIO", "5000")
    assert len(read_trace(bomb).nodes) == (256 << 10) - 1     # read to the end now: empty nodes


def test_config_depth_and_alias_limits_name_the_line_and_can_be_raised(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("a:\n  b: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(ManifestError, match=r"deep.yaml: line 2: nested more than 64 levels.*CHAKRA_SIM_MAX_CONFIG_DEPTH"):
        read_config_file(deep)
    monkeypatch.setenv("CHAKRA_SIM_MAX_CONFIG_DEPTH", "200")
    assert "b" in read_config_file(deep)["a"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    with pytest.raises(ManifestError, match=r"bomb.yaml: line \d+: expands to more than 1,000,000 values"):
        read_config_file(bomb)
    small = tmp_path / "small.yaml"         # 1 + 10 + 100 + 1,000 values once expanded
    small.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                     "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n")
    monkeypatch.setenv("CHAKRA_SIM_MAX_CONFIG_NODES", "500")
    with pytest.raises(ManifestError, match="small.yaml: line 3: expands to more than 500 values"):
        read_config_file(small)
    monkeypatch.setenv("CHAKRA_SIM_MAX_CONFIG_NODES", "2000")
    assert len(read_config_file(small)["c"]) == 10
    json_deep = tmp_path / "deep.json"
    json_deep.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ManifestError, match="deep.json: nested more than"):
        read_config_file(json_deep)


def test_duplicate_keys_nan_and_huge_integers_are_errors_naming_where(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text("network:\n  plugin: a\n  bandwidth: [1]\n  plugin: b\n")
    with pytest.raises(ManifestError, match=r"m.yaml: line 4: key 'plugin' is given twice \(first on line 2\)"):
        read_config_file(manifest)
    manifest.write_text("base: &b {x: 1}\nuse:\n  <<: *b\n  x: 2\n")    # a merge key may be overridden
    assert read_config_file(manifest)["use"] == {"x": 2}
    manifest.write_text("network:\n  bandwidth: [.nan]\n")
    with pytest.raises(ManifestError, match=r"m.yaml: network.bandwidth\[0\]: nan is not a finite number"):
        read_config_file(manifest)
    manifest.write_text(f"system:\n  splits: {2**70}\n")
    with pytest.raises(ManifestError, match="system.splits: 1180591620717411303424 does not fit a 64-bit"):
        read_config_file(manifest)
    system = tmp_path / "s.json"
    system.write_text('{"endpoint-delay": 1, "endpoint-delay": 2}')
    with pytest.raises(ManifestError, match="s.json: key 'endpoint-delay' is given twice"):
        read_config_file(system)


def test_a_misspelt_astra_system_key_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    from tests.fuzz_inputs import astra_cases

    case = next(c for c in astra_cases(full=False) if c.name == "typo-endpoint-delya" and c.command == "run")
    outcome = judge(case, tmp_path)
    assert outcome.verdict == "ok"     # ASTRA-sim ignores unknown keys; so do we, loudly
    assert "unknown key 'endpoint-delya' (did you mean 'endpoint-delay'?)" in outcome.output
    assert "not a key of ASTRA-sim's system file" in outcome.output


# Results ------------------------------------------------------------------------------------
_NUMBERS = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([10**18, 10**18 + 1, 1e18, 1.0000000000000002e18, 999, 1000, 1001]))
_DOCUMENTS = st.recursive(_NUMBERS | st.text(max_size=25) | st.booleans() | st.none(),
                          lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.sampled_from(["a", "finish_ns", "x_ns", "utilization", "7", "_ns",
                                                           'q"_ns', 'x_ns": 1', "flops"]), inner,
                                            max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(document=st.dictionaries(st.sampled_from(["ranks", "layers", "finish_ns"]), _DOCUMENTS, max_size=3),
       max_ns=st.sampled_from([10**18, 1000, 5]))
def test_the_quick_numbers_check_never_passes_what_the_exact_walk_refuses(document, max_ns) -> None:
    from chakra_core.report.results import _holdable, _walk_numbers

    quick = _holdable(document, max_ns)
    try:
        _walk_numbers(document, max_ns)
    except SimulationError:
        assert not quick


def test_a_large_number_that_is_not_a_time_passes_the_quick_check() -> None:
    """A 16,384-GPU job's total FLOPs (4e+19) is no time: the exact walk is not needed."""
    from chakra_core.report.results import _holdable

    assert _holdable({"layers": {"compute": {"flops": 4.064e19, "count": 10**19}}, "finish_ns": 12}, 10**18)
    assert not _holdable({"layers": {"compute": {"busy_ns": 4.064e19}}}, 10**18)
    assert not _holdable({"ranks": [{"finish_ns": 10**18 + 1}]}, 10**18)


def test_results_refuse_non_finite_numbers_and_absurd_times_naming_the_key() -> None:
    from chakra_core.report.results import _check_numbers
    from chakra_core.report.writers import results_json
    from tests.simhelpers import results_of

    with pytest.raises(SimulationError, match=r"layers.network.summary.utilization is nan"):
        _check_numbers({"layers": {"network": {"summary": {"utilization": float("nan")}}}})
    with pytest.raises(SimulationError, match=r"ranks\[0\].finish_ns is 2,000,000,000,000,000,000 ns"):
        _check_numbers({"ranks": [{"finish_ns": 2 * 10**18}]})
    with pytest.raises(ValueError):
        results_json(results_of([{"rank": 0}], {"network": {"x": float("inf")}}))


def test_a_time_beyond_the_limit_names_the_node_in_run_and_validate(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "duration-above-1e18-ns" and c.command == "run")
    ran = judge(case, tmp_path / "run")
    assert ran.verdict == "error" and "rank 0, node 9" in ran.output and "CHAKRA_SIM_MAX_TIME_NS" in ran.output
    validated = judge(Case("validate", case.name, case.build, case.names), tmp_path / "validate")
    assert validated.verdict == "error" and "t.0.et (rank 0), node 9: traced duration" in validated.output
    assert not (tmp_path / "run" / "out" / "results.json").exists()


def test_the_corpus_holds_each_reviewed_finding() -> None:
    """The review's findings are in the corpus this module runs (a guard against trimming it)."""
    names = {c.name for c in CASES}
    for finding in ("length-prefix-2^60", "gzip-bomb", "dev-zero", "node-with-40000-parents",
                    "non-minimal-varint-node", "duration-above-1e18-ns", "alias-bomb", "deep-nesting-list",
                    "duplicate-key", "typo-endpoint-delya", "system-deep-nesting", "network-bandwidth-nan"):
        assert finding in names
    assert dict(trace_mutations(full=False))["empty-file"] == b""


def test_the_corpus_holds_issue_33s_inputs_each_run_isolated() -> None:
    """/dev/zero and a writerless FIFO through every command that reads a file, numbers past 64 bits,
    a million ranks, rank files that are folders or dangling links: each in a subprocess under a
    2 GiB address-space limit (tests/fuzz_files.py)."""
    ids = {c.id for c in CASES if c.isolated}
    for command in ("run", "validate", "plan", "sweep", "generate job", "convert text", "convert pytorch",
                    "calibrate", "accuracy", "synthesize"):
        assert f"{command}:{command.split()[-1]}-dev-zero" in ids
    assert {"validate:validate-fifo", "run:astra-system-dev-zero", "run:seq-1e9", "validate:seq-1e9",
            "generate job:seq-1e9", "generate microbenchmark:size-2^70", "generate transformer:seq-1e12",
            "generate microbenchmark:npus-1e6", "synthesize:ranks-1e6", "jsonize:rank-file-directory",
            "obfuscate:rank-file-dangling-symlink", "validate:validate-over-the-size-limit"} <= ids


def test_the_corpus_is_listed_without_making_its_costly_inputs() -> None:
    """Listing the corpus (at collection) makes no gzip bomb nor 40,000-node trace: a case makes
    its bytes when it runs (collection took 6.5 s of tests/test_fuzz.py's, now well under 1 s)."""
    mutations = dict(trace_mutations(full=False))
    assert callable(mutations["gzip-bomb"]) and callable(mutations["node-with-40000-parents"])
