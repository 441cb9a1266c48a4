"""What one rank's traces say about their job: its process groups, what each communication operator
does, and which rank the traces are.

Process groups come from the host trace (process-group initialisation, `pg_config`), its Kineto
trace (`distributedInfo`) and the communication operators themselves; the rank from the Kineto
trace, the host trace or the communication operators, else `--rank`. `JobContext` also holds the
warnings and notes the conversion reports.
"""

from __future__ import annotations

from collections import Counter

from chakra_core.tools.pytorch.comms import CommInfo, Group, ProcessGroups
from chakra_core.tools.pytorch.errors import ConversionError
from chakra_core.tools.pytorch.host import HostTrace
from chakra_core.tools.pytorch.kineto import KinetoTrace
from chakra_core.tools.pytorch.units import Selection, select_units


class JobContext:
    """One rank's traces, their units, and the job around them (see the module docstring)."""

    groups: ProcessGroups
    """Every process group, once the communication operators are described (`_Converter.run`)."""
    rank: int
    """The rank the traces are (`_rank`)."""

    def __init__(self, host: HostTrace, kineto: KinetoTrace | None, rank: int | None):
        self.host, self.kineto, self.requested_rank = host, kineto, rank
        self.warnings: list[str] = list(host.warnings) + (list(kineto.warnings) if kineto else [])
        self.notes: list[str] = []
        self.selection: Selection = select_units(host)
        self.warnings.extend(self.selection.warnings)
        self.infos: dict[int, CommInfo] = {}        # communication unit op id -> what it does

    def _process_groups(self) -> ProcessGroups:
        groups = ProcessGroups()
        for op in self.selection.pg_inits:
            for value in op.inputs.values:
                groups.add_entries(value, f"{self.host.path}: {op.label()}", self.warnings)
        for op in self.selection.process_ops:
            if "pg_config" in op.attrs:
                groups.add_entries(op.attrs["pg_config"], f"{self.host.path}: {op.label()}", self.warnings)
        if self.kineto is not None:
            if "pg_config" in self.kineto.distributed:
                groups.add_entries(self.kineto.distributed["pg_config"],
                                   f"{self.kineto.path}: distributedInfo", self.warnings)
            groups.world_size = self.kineto.world_size
        return groups

    def _complete_groups(self, groups: ProcessGroups) -> None:
        """Groups only the communication operators describe, and collectives in unknown groups."""
        for op_id, info in self.infos.items():
            if info.pg_name is None:
                continue
            if info.group_ranks and (info.pg_name not in groups.groups or not groups.groups[info.pg_name].ranks):
                groups.add(Group(info.pg_name, info.group_ranks, len(info.group_ranks)))
            elif info.pg_name not in groups.groups and info.pg_name != "0":
                self.warnings.append(f"{self.host.path}: {self.host.ops[op_id].label()}: process group "
                                     f"{info.pg_name!r} is not defined in the traces; it is treated "
                                     "as every rank")
                groups.add(Group(info.pg_name, []))
        size = groups.job_size()
        if size and size > 1:
            spanning = [name for name, g in sorted(groups.groups.items()) if groups.spans_job(g)]
            if spanning:
                self.notes.append(f"process group(s) {', '.join(spanning)} span the whole job ({size} "
                                  "ranks): written as 'every rank of the simulated run', so a "
                                  "simulation of fewer ranks runs them among the ranks present")
            elif any(i.pg_name is None for i in self.infos.values()):
                self.notes.append(f"the job had {size} ranks; collectives without a process group run "
                                  "among every rank of the simulated run")

    def _rank(self) -> int:
        """The rank the traces record; --rank only fills in for traces that record none (and must
        agree with them); a trace without any rank or communication is a one-rank job (rank 0)."""
        found: list[tuple[int, str]] = []
        if self.kineto is not None and self.kineto.rank is not None:
            found.append((self.kineto.rank, f"{self.kineto.path} (distributedInfo.rank)"))
        host_rank, where = self.host.meta.get("rank"), "top-level 'rank'"
        for op in self.selection.process_ops:
            if "rank" in op.attrs:
                host_rank, where = op.attrs["rank"], f"{op.label()} 'rank' attribute"
        if not isinstance(host_rank, int) or isinstance(host_rank, bool):
            votes = Counter(i.rank for i in self.infos.values() if i.rank is not None)
            host_rank, where = (votes.most_common(1)[0][0] if votes else None), "record_param_comms"
        if isinstance(host_rank, int) and not isinstance(host_rank, bool):
            found.append((host_rank, f"{self.host.path} ({where})"))
        if found:
            rank, source = found[0]
            for other, place in found[1:]:
                if other != rank:
                    self.warnings.append(f"{place} says rank {other} but {source} says {rank}; "
                                         f"using {rank}")
            if self.requested_rank is not None and self.requested_rank != rank:
                raise ConversionError(f"--rank {self.requested_rank} contradicts {source}, which says "
                                      f"rank {rank}: drop --rank, or convert that rank's own trace")
            return rank
        if self.requested_rank is not None:
            return self.requested_rank
        size = self.groups.job_size()
        if not self.infos and (size or 1) == 1:
            self.notes.append("the trace records no rank and no communication: a one-rank job, "
                              "written as rank 0")
            return 0
        job = f"a {size}-rank job" if size else "a job with communication"
        kineto = "its Kineto trace has no distributedInfo.rank" if self.kineto is not None \
            else "no Kineto trace was given"
        raise ConversionError(f"{self.host.path}: the trace is one rank of {job} but does not say which "
                              f"(no rank in record_param_comms or a 'rank' field; {kineto}): give it "
                              "with --rank N")

    def _group_size(self, pg_name: str | None) -> int | None:
        """Members of a process group from its definition (unnamed: the job's default group)."""
        group = self.groups.groups.get(pg_name if pg_name is not None else "0")
        if group is not None and (group.size or group.ranks):
            return group.size or len(group.ranks)
        return self.groups.job_size()
