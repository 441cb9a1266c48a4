"""NCCL_ALGO and NCCL_PROTO (`algorithms`, `protocols` of the nccl layer; `chakra-sim accuracy
--nccl-algo / --nccl-proto`): NCCL chooses among the forced pairs only, forcing its own free choice
(or every pair) changes nothing, a collective left with no pair is an error naming what NCCL
considers, and a log's runs carry the forcing into the system layer and into calibration."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from chakra_core import ManifestError, SimulationError, pb
from chakra_core.cli import main
from chakra_core.hardware.profiles import load_profile
from chakra_core.testing import collective, simulate, write_ranks
from chakra_sim_system_nccl import accuracy as acc
from chakra_sim_system_nccl import calibrate as cal
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.nccl_tests import load

H100, NDR = "h100-sxm-hgx", "h100-hgx-ndr400"
DATA = Path(__file__).resolve().parent / "data" / "nccl-tests"
DGX = DATA / "h100_dgx_1node_8gpu_allreduce_nvidia-dgxc.txt"
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree")
PROTOCOLS = ("LL", "LL128", "Simple")


def run(tmp_path: Path, ranks: int, size: int, profile: str = H100, **system: object) -> dict:
    prefix = write_ranks(tmp_path / "t", [[collective(0, pb.ALL_REDUCE, size)]] * ranks)
    return simulate({"workload": {"trace": prefix}, "system": {"plugin": "nccl", "profile": profile, **system}})


@pytest.mark.parametrize(("algorithm", "protocol"), [("ring", None), ("tree", "LL128"), ("nvls", None)])
def test_the_forced_pair_is_chosen_and_timed(tmp_path, algorithm, protocol):
    """One node of 8 H100, 16 MiB: the layer times what NCCL runs with only those pairs offered."""
    forced = {"algorithms": [algorithm], **({"protocols": [protocol]} if protocol else {})}
    results = run(tmp_path, 8, 16 << 20, **forced)
    model = nccl.NcclModel(load_profile(H100), algorithms=[algorithm], protocols=[protocol] if protocol else None)
    expected = model.time_us(nccl.ALL_REDUCE, 16 << 20, 8, 1)
    [choice] = results["layers"]["system"]["summary"]["choices"]
    assert choice["algorithm"] == algorithm and (protocol is None or choice["protocol"] == protocol)
    assert results["finish_ns"] == int(round(expected.time_us * 1000))


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 8 << 30), nodes=st.sampled_from([1, 2, 4]),
       collective_name=st.sampled_from([nccl.ALL_REDUCE, nccl.ALL_GATHER, nccl.REDUCE_SCATTER]))
def test_forcing_what_nccl_would_choose_changes_nothing(size, nodes, collective_name):
    """Offering every pair, or only the pair NCCL picks freely, gives NCCL's free choice and time."""
    profile = load_profile(NDR)
    free = nccl.NcclModel(profile).time_us(collective_name, size, 8 * nodes, nodes)
    everything = nccl.NcclModel(profile, algorithms=ALGORITHMS, protocols=PROTOCOLS)
    own = nccl.NcclModel(profile, algorithms=[free.algorithm], protocols=[free.protocol])
    for model in (everything, own):
        assert model.time_us(collective_name, size, 8 * nodes, nodes) == free


def test_no_pair_left_is_an_error_that_names_the_choices(tmp_path):
    with pytest.raises(SimulationError, match=r"NCCL_ALGO=nvls leaves NCCL no algorithm for all_reduce on 16 GPUs "
                                              r"over 2 node\(s\); it considers .*ring/Simple"):
        run(tmp_path, 16, 1 << 20, NDR, algorithms=["nvls"])


def test_an_unknown_name_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match="algorithms"):
        run(tmp_path, 8, 1 << 20, algorithms=["collnet"])


def test_a_logs_runs_carry_the_forcing_and_the_cli_takes_it():
    plan = acc.plan_log(load(DGX), load_profile(H100), H100, algorithms=["ring"], protocols=["Simple"])
    assert plan.system()["algorithms"] == ["ring"] and plan.system()["protocols"] == ["Simple"]
    assert {c.algorithm for c in acc.nccl_choices(plan, load_profile(H100))} == {"ring"}
    out = CliRunner().invoke(main, ["accuracy", str(DGX), "--profile", H100, "--nccl-algo", "ring",
                                    "--nccl-proto", "Simple", "--max-bytes", "65536", "--json"])
    assert out.exit_code == 0, out.output
    assert '"algorithms": [\n' in out.output and '"ring"' in out.output and '"nvls"' not in out.output


def test_calibration_fits_the_forced_runs():
    """calibrate --nccl-algo: the observations carry the forcing, so predictions and the fit use it."""
    points = cal.observations([load(DGX)], 8, algorithms=["ring"], protocols=["Simple"])
    assert {(c.algorithm, c.protocol) for c in cal.predict(load_profile(H100), points)} == {("ring", "Simple")}
    out = CliRunner().invoke(main, ["calibrate", str(DGX), "--profile", H100, "--nccl-algo", "nvls",
                                    "--nccl-proto", "LL"])
    assert out.exit_code != 0 and "NCCL_ALGO=nvls and NCCL_PROTO=LL leaves NCCL no algorithm" in out.output
