"""GPUs per NVLink domain when a domain spans several hosts (issue 35 item 2): the Slurm
segment rule Megatron-Bridge's launcher uses on NVL72 racks, and `validate` saying it."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from chakra_core.cli import main
from chakra_core.hardware.profiles import load_profile
from chakra_core.jobs.domains import HOSTS_PER_SEGMENT, domain_note, job_gpus_per_node
from chakra_core.jobs.spec import Cluster


def _per_node(gpus: int, profile: str = "gb200-nvl72-ndr400", given: int | None = None) -> int:
    cluster = Cluster(gpus=gpus, profile=profile, gpus_per_node=given)
    return job_gpus_per_node(cluster, load_profile(profile))


@pytest.mark.parametrize("gpus, expected", [(8, 72), (72, 72), (144, 72), (576, 72), (128, 64), (256, 64),
                                            (1024, 64), (204, 68), (250, 72), (4 * 37, 4)])
def test_nvl72_jobs_fill_equal_shares_of_their_domains(gpus, expected):
    """Trays (4 GPUs) split into the largest segment of at most 18 that divides them: 37 trays,
    a prime above 18, give segments of one tray, as Megatron-Bridge's loop ends there; GPUs that
    are not whole trays keep the domain."""
    assert _per_node(gpus) == expected


def test_the_rule_reads_the_profiles_host_and_a_job_may_override_it():
    assert load_profile("gb300-nvl72-xdr800").node.gpus_per_host.value == 4
    assert _per_node(256, "gb300-nvl72-xdr800") == 64
    assert _per_node(256, given=72) == 72 and _per_node(256, given=32) == 32
    for gpus in (16, 256, 1000):   # an HGX node is its own host: nodes as before
        assert _per_node(gpus, "h100-hgx-ndr400") == 8


def test_every_domain_holds_the_same_whole_hosts_and_no_more_than_a_rack():
    profile = load_profile("gb200-nvl72-ndr400")
    for trays in range(19, 300):   # (up to 18 trays, one domain holds the job)
        used = job_gpus_per_node(Cluster(gpus=4 * trays, profile="gb200-nvl72-ndr400"), profile)
        assert used % 4 == 0 and used <= 72 and (4 * trays) % used == 0
        assert used // 4 <= HOSTS_PER_SEGMENT


def test_validate_says_how_the_domains_are_shared(tmp_path):
    manifest = {"job": {"name": "l8b", "model": "llama3-8b", "parallel": {"tp": 1, "pp": 1},
                        "training": {"seq": 8192, "global_batch": 256, "micro_batch": 1},
                        "cluster": {"gpus": 256, "profile": "gb200-nvl72-ndr400"}},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "64 per node" in result.output and "64 of each 72-GPU NVLink domain" in " ".join(result.output.split())
    assert domain_note(Cluster(gpus=144, profile="gb200-nvl72-ndr400"), load_profile("gb200-nvl72-ndr400")) is None
