"""How many of a job's GPUs share one NVLink domain: the `gpus_per_node` placement and the layers use.

A profile's node is its NVLink domain (docs/hardware.md, "NVLink domains larger than a host"). Where
the domain spans several hosts (`node.gpus_per_host`: an NVL72 rack's 18 compute trays of 4 GPUs),
a job of more GPUs than a domain holds need not fill whole domains, and Megatron-Bridge's launcher
does not ask for that: it asks Slurm for `--segment` = the job's trays when they fit one rack
(at most 18), else the largest divisor of its trays that is at most 18, so that every domain holds
the same number of the job's trays (NVIDIA-NeMo/Megatron-Bridge v0.5.0,
scripts/performance/utils/executors.py slurm_executor: "add --segment flag to sbatch if job uses
GB200"). 256 GPUs on NVL72 racks are 64 trays, segments of 16: 64 GPUs per domain, as the published
GB200 and GB300 256-GPU runs were placed. A job's `cluster.gpus_per_node` overrides the rule.
"""

from __future__ import annotations

from chakra_core.hardware.profiles import Profile
from chakra_core.jobs.spec import Cluster

HOSTS_PER_SEGMENT = 18
"""Megatron-Bridge's largest segment: the compute trays of one NVL72 rack (executors.py, range(18, 0, -1))."""


def job_gpus_per_node(cluster: Cluster, profile: Profile) -> int:
    """GPUs of the job per NVLink domain (see the module docstring)."""
    if cluster.gpus_per_node is not None:
        return cluster.gpus_per_node
    domain = profile.gpus_per_node
    given = profile.node.gpus_per_host
    host = max(1, int(given.value)) if given is not None else domain
    if host >= domain or cluster.gpus <= domain or cluster.gpus % host:
        return domain
    hosts = cluster.gpus // host
    fits = min(domain // host, HOSTS_PER_SEGMENT)
    return host * next(segment for segment in range(fits, 0, -1) if hosts % segment == 0)


def domain_note(cluster: Cluster, profile: Profile) -> str | None:
    """What `validate` says when the job fills its NVLink domains partly (None when it fills them)."""
    used, domain = job_gpus_per_node(cluster, profile), profile.gpus_per_node
    if cluster.gpus_per_node is not None or used == domain:
        return None
    return (f"{used} of each {domain}-GPU NVLink domain: the job's {cluster.gpus // used} domains hold equal "
            "shares of its hosts, as Megatron-Bridge's Slurm --segment asks (chakra_core/jobs/domains.py)")
