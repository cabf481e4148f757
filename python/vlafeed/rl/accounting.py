"""Exact trajectory accounting for vlafeed.rl.

Every episode a rollout worker starts gets its id from the Ledger, a small Ray actor the driver
owns: ``w{worker}.e{counter}``, where the counter is the worker's and lives in the Ledger, not in
the worker. A worker that Ray restarts registers again (a new incarnation) and goes on from the
Ledger's counter, so an id is never produced twice and no counter value is skipped.

At the end, each produced id gets exactly one fate (``fates``):
  trained, dropped_stale (lag > max_lag), dropped_env (the env raised), left_in_queue_at_end
  (pushed but never taken, or taken beyond a synchronous round's batch), lost_to_faults (started
  by an incarnation that died and never reached the learner: in flight or not yet pushed), and
  in_flight_at_end (started by a live worker, abandoned when the run stopped).
so that produced == the sum of the others, by id and by count.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from vlafeed.rl.config import RLError

FATES = ("trained", "dropped_stale", "dropped_env", "left_in_queue_at_end", "lost_to_faults", "in_flight_at_end")

_CLASS = []


def ledger_class():
    """The Ledger Ray actor class (made once per process)."""
    if _CLASS:
        return _CLASS[0]
    import ray

    @ray.remote
    class Ledger:
        def __init__(self, num_workers: int, start: Optional[List[int]] = None):
            # start: each worker's first counter (a resumed run goes on from its checkpoint's counters)
            self.start = list(start) if start else [0] * num_workers
            self.next = list(self.start)
            self.incarnations = [0] * num_workers
            self.issued: Dict[str, tuple] = {}
            self.env_dropped: List[str] = []

        def register(self, wid: int) -> int:
            """A worker (re)starts: its incarnation number (0 first, 1 after the first restart...)."""
            inc = self.incarnations[wid]
            self.incarnations[wid] += 1
            return inc

        def issue(self, wid: int, incarnation: int) -> str:
            c = self.next[wid]
            self.next[wid] += 1
            tid = f"w{wid}.e{c}"
            self.issued[tid] = (wid, incarnation, c)
            return tid

        def dropped_by_env(self, tid: str) -> None:
            self.env_dropped.append(tid)

        def snapshot(self) -> dict:
            return {"issued": dict(self.issued), "env_dropped": list(self.env_dropped), "start": list(self.start),
                    "incarnations": list(self.incarnations), "next": list(self.next)}

    _CLASS.append(Ledger)
    return Ledger


class TrainedOnce:
    """Raises RLError if a trajectory id reaches the learner a second time."""

    def __init__(self):
        self.seen = set()

    def check(self, ids: Iterable[str]) -> None:
        for t in ids:
            if t in self.seen:
                raise RLError(f"trajectory {t} reached the learner twice (accounting bug)")
            self.seen.add(t)


def fates(snapshot: dict, trained: List[str], dropped_stale: List[str], left_in_queue: List[str]) -> dict:
    """Each produced id's fate; RLError if an id was trained twice, has two fates, or was never produced."""
    issued = snapshot["issued"]
    latest = {w: n - 1 for w, n in enumerate(snapshot["incarnations"])}
    out: Dict[str, List[str]] = {k: [] for k in FATES}
    seen: Dict[str, str] = {}

    def put(fate, tid):
        if tid not in issued:
            raise RLError(f"trajectory {tid} ({fate}) was never produced by a worker (accounting bug)")
        if tid in seen:
            raise RLError(f"trajectory {tid} is both {seen[tid]} and {fate} (accounting bug)")
        seen[tid] = fate
        out[fate].append(tid)

    for fate, ids in (("trained", trained), ("dropped_stale", dropped_stale), ("left_in_queue_at_end", left_in_queue),
                      ("dropped_env", snapshot["env_dropped"])):
        for t in ids:
            put(fate, t)
    for tid, (wid, inc, _c) in issued.items():
        if tid not in seen:
            put("in_flight_at_end" if inc == latest[wid] else "lost_to_faults", tid)
    counts = {k: len(v) for k, v in out.items()}
    produced = len(issued)
    if produced != sum(counts.values()):
        raise RLError(f"accounting does not add up: produced {produced} != {counts}")
    start = snapshot.get("start") or [0] * len(snapshot["next"])
    for w, n in enumerate(snapshot["next"]):  # contiguous counters: nothing skipped
        got = sorted(c for (wid, _i, c) in issued.values() if wid == w)
        if got != list(range(start[w], n)):
            raise RLError(f"worker {w}: episode counters not contiguous (accounting bug)")
    return {"produced": produced, **counts, "ids": out,
            "incarnations": snapshot["incarnations"],
            "restarted_ids": {t: [w, i] for t, (w, i, _c) in issued.items() if i > 0}}


def summary_line(acct: dict) -> str:
    return (f"produced {acct['produced']} = trained {acct['trained']} + stale {acct['dropped_stale']} + env errors "
            f"{acct['dropped_env']} + lost to faults {acct['lost_to_faults']} + in flight at end "
            f"{acct['in_flight_at_end']} + left in queue {acct['left_in_queue_at_end']}")
