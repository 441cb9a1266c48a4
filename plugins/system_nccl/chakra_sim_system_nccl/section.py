"""The profile sections the NCCL plugin owns (docs/hardware.md): `nccl`, what NCCL's topology
search and tuning derive from the hardware, and `calibration`, what `chakra-sim calibrate` fits;
and the GPU memory NCCL's buffers take per communicator, which `chakra-sim plan` reserves."""

from __future__ import annotations

from pydantic import Field

from chakra_core import Profile, SimulationError, Sourced
from chakra_core.contract import ProfileSectionModel as _Strict

NCCL_KEY, CALIBRATION_KEY = "nccl", "calibration"
"""Where a profile gives the sections."""


class NcclSpec(_Strict):
    """What NCCL's topology search and tuning derive from this hardware (NCCL's public source)."""

    graph_channels: Sourced = Field(
        ..., description="channels NCCL's intra-node ring search finds (graph nChannels); tuning's bus "
                         "bandwidth is graph_channels x channel_bw_gbps")
    channel_bw_gbps: Sourced = Field(..., description="bandwidth per channel the search settles on (bwIntra), GB/s")
    channels: Sourced = Field(..., description="ring/tree channels of a communicator (comm->nChannels, "
                                               "the search's channels duplicated)")
    nvls_channels: Sourced | None = Field(None, description="NVLS channels (NVLS_NCHANNELS_SM90, NVLS_NCHANNELS_SM100_NVL)")
    nvls_bus_bw_gbps: Sourced | None = Field(
        None, description="bus bandwidth of the NVLS graph (one channel per GPU, 32 at most, x its bwIntra), GB/s; "
                          "NCCL's tuning takes nvlsEfficiency of twice it for an all-reduce")
    nvls_inter_bw_gbps: Sourced | None = Field(
        None, description="bwInter of the NVLS graph per channel, GB/s (the search's second pass raises it); "
                          "caps an NVLS channel's bandwidth; default its bwIntra")


class Calibration(_Strict):
    """Physical parameters `chakra-sim calibrate` fits to measurements, in place of the spec-only
    values (absent from spec-only profiles). Each is one property of the machine, so a fit on one
    collective at one scale carries to the others."""

    source: str
    step_overhead_us: float | None = Field(
        None, ge=0, description="synchronisation cost of one Simple-protocol step over NVLink, µs "
                                "(spec-only: NCCL's LL per-hop NVLink latency)")
    hop_latency_scale: float = Field(1.0, gt=0, description="factor on NCCL's per-hop step latencies over NVLink")
    nvlink_efficiency: float = Field(1.0, gt=0, le=1.0, description="fraction of the NVLink bandwidth NCCL's "
                                                                     "topology search counts that collectives reach")
    nic_efficiency: float = Field(1.0, gt=0, le=1.0, description="fraction of the NICs' line rate reached")
    network_latency_us: float | None = Field(
        None, ge=0, description="latency of one network step beyond NCCL's table, µs (spec-only: the profile's "
                                "network.extra_latency_us)")
    launch_us: float | None = Field(None, ge=0, description="host time to launch one kernel, µs "
                                                            "(spec-only: node.kernel_launch_us)")
    proxy_post_us: float | None = Field(
        None, ge=0, description="host time NCCL's proxy thread spends on one network step, µs (spec-only: "
                                "NCCL's network post overhead, 1 µs on Intel hosts, 2 on AMD)")


NCCL_PROTOCOL_BUFFERS = 524_288 + 4_915_200 + 4_194_304
"""One NCCL connection's buffers, one per protocol (NVIDIA/nccl src/init.cc DEFAULT_LL_BUFFSIZE,
DEFAULT_LL128_BUFFSIZE, DEFAULT_BUFFSIZE with src/include/device.h, commit
0f900e1bb7806fcc4252301cf7977d3d68beb0e2): LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB,
LL128 120 elements x 640 threads x 8 steps x 8 B = 4,800 KiB, Simple NCCL_BUFFSIZE 4 MiB."""

NCCL_RING_CONNECTIONS = 2
"""Connections a GPU holds per channel of a ring, its send and its receive: "Ring uses a limited amount
of memory as it only has 2 connections regardless of the scale", and "the memory usage is linearly tied
to the number of channels" (sjeaugey, NCCL maintainer, https://github.com/NVIDIA/nccl/issues/864)."""

NCCL_RING_BYTES = NCCL_RING_CONNECTIONS * NCCL_PROTOCOL_BUFFERS
"""NCCL's buffers per channel of one communicator: 18.4 MiB."""


def communicator_bytes(spec: NcclSpec) -> int:
    """NCCL's buffers one communicator holds on each of its GPUs: NCCL_RING_BYTES per channel."""
    return int(spec.channels.value) * NCCL_RING_BYTES


def nccl_of(profile: Profile) -> NcclSpec:
    """The profile's `nccl` section; SimulationError if it has none (the model needs it)."""
    spec = profile.section(NCCL_KEY, NcclSpec)
    if spec is None:
        raise SimulationError(f"profile '{profile.name}' has no nccl section (NCCL's channels and their "
                              "bandwidth, which the nccl system layer needs); see docs/hardware.md")
    return spec


def calibration_of(profile: Profile) -> Calibration | None:
    """The profile's fitted `calibration`, if it has one."""
    return profile.section(CALIBRATION_KEY, Calibration)
