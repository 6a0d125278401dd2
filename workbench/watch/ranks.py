"""Under DDP every rank watches its own process; ``merged(report)`` gathers the ranks' reports (as plain
dicts, ``torch.distributed.all_gather_object``) and gives rank 0 one ``Report.merge`` of them — findings
concatenated (each still names its call site), counters summed. Without an initialised process group it
returns the report unchanged. Torch and the standard library only.
"""

from __future__ import annotations

import torch.distributed as dist

from workbench.watch.report import Report


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when no process group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def merged(report: Report) -> Report | None:
    """Rank 0: every rank's report merged (rank ids in ``observed["ranks"]``); other ranks: None. A
    collective: every rank must call it."""
    rank, size = world()
    if size == 1:
        return report
    parts: list = [None] * size
    dist.all_gather_object(parts, report.to_dict())
    if rank != 0:
        return None
    out = Report.merge(Report.from_dict(part) for part in parts)
    out.observed["ranks"] = size
    return out
