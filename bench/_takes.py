"""How a benchmark's take ended, for the benchmarks that drive ``hilrec daemon`` over its control
socket (bench_daemon, bench_leader_follow, bench_rollout, bench_verdict, bench_view_load).

On a loaded machine the daemon may end a take itself before the benchmark's ``stop_episode``
arrives (an emulated arm's replies held in the pty past the failed-tick bound, encoders behind:
``fault:device_lost``, ``fault:spill_full``). Such a take is saved all the same; it is that run's
result, so the table says how the take ended instead of the benchmark stopping on the refused
stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class _Client(Protocol):
    def request(self, cmd: str, **args: Any) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class TakeEnd:
    ended_by: str  # "stop", or the fault that ended the take first ("fault:...")
    episode_index: int
    frames: int
    saved: bool


def stop_take(client: _Client, **args: Any) -> TakeEnd:
    """Stop the take (``args``: stop_episode's, e.g. ``success``) and say what ended it; a
    refusal for any other reason is raised."""
    stop = client.request("stop_episode", **args)
    if stop["ok"]:
        frames = int(stop.get("frames") or 0)
        return TakeEnd(ended_by="stop", episode_index=int(stop["episode_index"]), frames=frames, saved=True)
    status = client.request("status")
    last = status.get("last_episode") or {}
    ended_by = str(last.get("ended_by", ""))
    if not ended_by.startswith("fault:"):
        raise RuntimeError(f"stop_episode refused: {stop['error']}; faults {status['faults']}; last {last}")
    saved = not last.get("discarded") and last.get("saved") is not False
    index, frames = int(last["episode_index"]), int(last.get("frames") or 0)
    return TakeEnd(ended_by=ended_by, episode_index=index, frames=frames, saved=saved)
