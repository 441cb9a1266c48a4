"""`chakra-sim validate`: what `run` would reject, found without simulating."""

from __future__ import annotations

import gzip
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.engine.simulation import Simulation
from chakra_core.schema import pb
from tests.helpers import make_node
from tests.simhelpers import MICRO, collective, comp, write_ranks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"
CONFIGS = ROOT / "examples" / "configs"


@pytest.fixture(autouse=True)
def no_simulation(monkeypatch):
    """validate must never run the event loop."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("validate simulated")
    monkeypatch.setattr(Simulation, "run", refuse)


def validate(*args):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


def manifest(tmp_path: Path, prefix: str, npus: int, extra: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"workload: {{trace: {prefix}}}\n"
                    f"network: {{plugin: analytical, topology: [Ring], npus_count: [{npus}], "
                    f"bandwidth: [50], latency: [500]}}\n"
                    f"output: {{dir: {tmp_path / 'out'}}}\n{extra}")
    return path


def problem_lines(result) -> list[str]:
    """The problems under the `error:` line (warnings come before it)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert "not valid" in lines[start]
    return [line.strip() for line in lines[start + 1:] if line.strip()]


def test_a_valid_manifest_and_valid_flags():
    result = validate(EXAMPLE)
    assert result.exit_code == 0, result.output
    assert "valid (8 rank(s); system=native, compute=replay, network=analytical)" in result.output
    result = validate("--workload", MICRO / "all_reduce" / "8npus_1MB" / "all_reduce",
                      "--astra-system", CONFIGS / "Ring_4chunks.json",
                      "--astra-network", CONFIGS / "Ring_8npus.yml", "--network", "analytical")
    assert result.exit_code == 0, result.output
    assert "command line: valid (8 rank(s)" in result.stdout
    assert "warning:" in result.stderr and "boost-mode" in result.stderr


def test_manifest_problems_are_listed_with_their_key_paths(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {trace: nowhere}\nnetwork: {plugin: analytical, topology: [Ring]}\n")
    result = validate(bad)
    assert result.exit_code == 2
    assert "network.npus_count: Field required" in result.output
    assert "workload.trace: no trace files" in result.output


def test_rank_and_npu_count_mismatch(tmp_path):
    result = validate(manifest(tmp_path, MICRO / "all_reduce" / "4npus_1MB" / "all_reduce", 8))
    [line] = problem_lines(result)
    assert line.startswith(f"{tmp_path / 'm.yaml'}: the trace has 4 rank(s) (")
    assert "all_reduce.0.et ...) but the network (plugin 'analytical') has 8 NPUs; they must match" in line


def test_truncated_and_corrupt_trace_files(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 5), comp(2, 5, deps=[1])]] * 3)
    rank1 = Path(f"{prefix}.1.et")
    rank1.write_bytes(rank1.read_bytes()[:-3])
    Path(f"{prefix}.2.et").write_bytes(gzip.compress(b"\x05abc")[:-6])   # gzip magic, then garbage
    lines = problem_lines(validate(manifest(tmp_path, prefix, 3)))
    assert len(lines) == 2
    assert lines[0].startswith(f"rank 1: {rank1}: at byte ") and "truncated file" in lines[0]
    assert lines[1].startswith(f"rank 2: {prefix}.2.et: at byte 0: corrupt gzip stream")


def test_unusable_dependency_graph(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 5, deps=[2]), comp(2, 5, deps=[1])], [comp(1, 5)]])
    lines = problem_lines(validate(manifest(tmp_path, prefix, 2)))
    assert len(lines) == 1 and lines[0].startswith("rank 0: ") and "cycle" in lines[0]


def test_collectives_of_different_type_or_size(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, 1024), collective(2, pb.ALL_GATHER, 64, deps=[1])],
             [collective(1, pb.ALL_REDUCE, 1024), collective(2, pb.ALL_REDUCE, 64, deps=[1])],
             [collective(1, pb.ALL_REDUCE, 512), collective(2, pb.ALL_GATHER, 64, deps=[1])]]
    prefix = write_ranks(tmp_path / "t", ranks)
    assert problem_lines(validate(manifest(tmp_path, prefix, 3))) == [
        f"{prefix}.1.et (rank 1), node 2 ('node2'): collective #2 in all ranks is ALL_REDUCE of 64 B, "
        "but rank 0's (node 2) is ALL_GATHER of 64 B",
        f"{prefix}.2.et (rank 2), node 1 ('node1'): collective #1 in all ranks is ALL_REDUCE of 512 B, "
        "but rank 0's (node 1) is ALL_REDUCE of 1024 B"]


def test_collectives_are_matched_in_node_id_order_per_group(tmp_path):
    # Rank 1 lists its nodes in another file order; ids decide. Group "g" is ranks 0 and 1 only;
    # pg_name "0" is all ranks, like no pg_name. Barrier sizes do not matter.
    ranks = [[collective(1, pb.ALL_REDUCE, 64, pg_name="g"), collective(2, pb.ALL_GATHER, 32),
              collective(3, pb.BARRIER, 0, deps=[2])],
             [collective(7, pb.BARRIER, 8, deps=[5]), collective(5, pb.ALL_GATHER, 32, pg_name="0"),
              collective(4, pb.ALL_REDUCE, 64, pg_name="g")],
             [collective(1, pb.ALL_GATHER, 32), collective(2, pb.BARRIER, 0, deps=[1])]]
    prefix = write_ranks(tmp_path / "t", ranks)
    result = validate(_with_groups(tmp_path, prefix, 3))
    assert result.exit_code == 0, result.output


def _with_groups(tmp_path: Path, prefix: str, npus: int, groups: str = "{g: [0, 1]}") -> Path:
    path = manifest(tmp_path, prefix, npus)
    path.write_text(path.read_text().replace(f"trace: {prefix}}}", f"trace: {prefix}, comm_groups: {groups}}}"))
    return path


def test_group_membership_and_counts(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, 64, pg_name="g"), collective(2, pb.ALL_REDUCE, 64, pg_name="g")],
             [collective(1, pb.ALL_REDUCE, 64, pg_name="g")],
             [collective(1, pb.ALL_REDUCE, 64, pg_name="g")],
             [collective(1, pb.ALL_REDUCE, 64, pg_name="nowhere")]]
    prefix = write_ranks(tmp_path / "t", ranks)
    lines = problem_lines(validate(_with_groups(tmp_path, prefix, 4)))
    assert lines == [
        f"{prefix}.2.et: rank 2, node 1 ('node1'): rank 2 is not a member of communicator group 'g' [0, 1]",
        f"{prefix}.1.et (rank 1): issues 1 collective(s) in group 'g', rank 0 issues 2; rank 0's node 2 "
        "('node2') would wait forever for rank 1",
        f"{prefix}.3.et: rank 3, node 1 ('node1'): communicator group 'nowhere' is not defined (give a "
        "comm-group JSON, or a METADATA node defining it)"]


def test_unknown_collective_type_and_memory_nodes_without_a_memory_layer(tmp_path):
    ranks = [[collective(1, 99, 64), make_node(2, pb.MEM_LOAD_NODE, attrs={"tensor_size": 8})],
             [comp(1, 1)]]
    prefix = write_ranks(tmp_path / "t", ranks)
    assert problem_lines(validate(manifest(tmp_path, prefix, 2))) == [
        f"{prefix}.0.et (rank 0), node 1 ('node1'): unknown collective type 99",
        f"{prefix}.0.et (rank 0), node 2: memory loads/stores need a memory layer (a `memory:` "
        "section; `chakra-sim plugins --layer memory` lists them)"]


def test_an_output_folder_that_cannot_be_created(tmp_path):
    (tmp_path / "afile").write_text("")
    result = validate(EXAMPLE, "--out", tmp_path / "afile" / "out")
    assert problem_lines(result) == [f"cannot create the output folder {tmp_path / 'afile' / 'out'}: "
                                     f"{tmp_path / 'afile'} is a file, not a folder"]
    assert not (tmp_path / "afile" / "out").exists()


def test_every_problem_at_once_and_flags_are_shared_with_run(tmp_path):
    ranks = [[collective(1, pb.ALL_REDUCE, 64)], [collective(1, pb.ALL_GATHER, 64)]]
    prefix = write_ranks(tmp_path / "t", ranks)
    result = validate("--workload", prefix, "--astra-system", CONFIGS / "Ring_4chunks.json",
                      "--astra-network", CONFIGS / "Ring_8npus.yml")
    lines = problem_lines(result)
    assert "the trace has 2 rank(s)" in lines[0] and "has 8 NPUs" in lines[0]
    assert "collective #1 in all ranks is ALL_GATHER of 64 B" in lines[1]
    context = click.Context(main)
    run_params = {p.name for p in main.get_command(context, "run").params}
    validate_params = {p.name for p in main.get_command(context, "validate").params}
    assert run_params - validate_params == {"quiet", "plots", "all_ranks"}    # how run shows results, not inputs


def test_a_comm_group_naming_a_missing_rank_is_reported_once(tmp_path):
    prefix = write_ranks(tmp_path / "t", [[comp(1, 1)]] * 2)
    lines = problem_lines(validate(_with_groups(tmp_path, prefix, 2, "{g: [0, 5]}")))
    assert len(lines) == 1 and "communicator group 'g'" in lines[0] and "names rank(s) [5]" in lines[0]


def test_uneven_all_to_all_pieces_that_disagree(tmp_path):
    """Rank 0 says it sends 100 B to rank 1; rank 1 says it receives 60 B from rank 0."""
    def a2a(send, recv):
        return [collective(1, pb.ALL_TO_ALL, sum(send), comm_send_splits=send, comm_recv_splits=recv)]
    prefix = write_ranks(tmp_path / "t", [a2a([0, 100], [0, 40]), a2a([40, 0], [60, 0])])
    lines = problem_lines(validate(manifest(tmp_path, prefix, 2)))   # beside the native layer's refusal
    assert any(line.endswith("uneven all-to-all ALL_TO_ALL of 100 B among all ranks (#1 there): rank 0 (node 1) "
                             "sends 100 B to rank 1, but rank 1 (node 1) receives 60 B from it (comm_send_splits / "
                             "comm_recv_splits)") for line in lines)


def test_uneven_all_to_all_on_the_native_layer(tmp_path):
    """validate says what the run would: the native layer refuses pieces of their own."""
    def a2a(send, recv):
        return [collective(1, pb.ALL_TO_ALL, sum(send), comm_send_splits=send, comm_recv_splits=recv)]
    prefix = write_ranks(tmp_path / "t", [a2a([0, 100], [0, 40]), a2a([40, 0], [100, 0])])
    (line,) = problem_lines(validate(manifest(tmp_path, prefix, 2)))
    assert line == (f"{prefix}.0.et (rank 0), node 1: an uneven all-to-all (comm_send_splits / comm_recv_splits, "
                    "PyTorch's all_to_all_single with split sizes) runs on the nccl system layer (system: {plugin: "
                    "nccl}); the native layer plans every collective as ASTRA-sim does, even, from its first "
                    "member's comm_size")
