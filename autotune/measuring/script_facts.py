"""What a probe's ranks said about the script itself, folded from their ``seen`` messages.

The first DataLoader's batch size and workers, DDP and its bucket size, the distributed
backend and torch's world size, the threads it set, whether it starts its own ranks, and the
files it wrote into the user's tree. The tuner builds its search space from these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probes import protocol


@dataclass
class Seen:
    facts: dict = field(default_factory=dict)  # TrialResult.seen, less the writes
    loader_batch: int | None = None  # the batch size the script's first DataLoader got
    writes: dict[str, dict] = field(default_factory=dict)  # path -> {path, op, existed}

    def fold(self, msg: dict) -> None:
        what = msg.get("what")
        requested = msg.get("requested") or {}
        applied = msg.get("applied") or {}
        facts = self.facts
        if what == "dataloader" and msg.get("tag") == 0:
            facts.setdefault("batch_size", requested.get("batch_size"))
            facts.setdefault("workers", requested.get("workers"))
            for name in ("prefetch", "persistent", "pin_memory", "dataset_len"):
                if requested.get(name) is not None:
                    facts.setdefault(name, requested[name])
            if self.loader_batch is None:
                self.loader_batch = applied.get("batch_size")
        elif what == "writes":
            for write in msg.get("paths") or []:
                if isinstance(write, dict) and write.get("path"):
                    self.writes.setdefault(write["path"], write)
        elif what == "ddp":
            facts.setdefault("ddp", True)
            facts.setdefault("bucket_mb", requested.get("bucket_mb"))
        elif what == "distributed":
            facts.setdefault("backend", requested.get("backend"))
            world = applied.get("world_size")
            if isinstance(world, int) and world > facts.get("world_size", 0):
                facts["world_size"] = world  # torch's: counts ranks the script started
        elif what == "threads":
            facts.setdefault("threads", requested)
        elif what == protocol.SEEN_STARTED_BY_SCRIPT:
            facts.setdefault("started_by_script", requested.get("start_method"))

    def world_size(self) -> int:
        return int(self.facts.get("world_size") or 0)

    def result(self) -> dict:
        """``TrialResult.seen``: the facts, with the writes sorted by path."""
        out = dict(self.facts)
        if self.writes:
            out["writes"] = sorted(self.writes.values(), key=lambda w: w["path"])
        return out
