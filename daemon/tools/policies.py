"""The policies ``hilrec eval`` runs: loaded by :mod:`hilrec.daemon.policy.load`, the one loader
that ``hilrec eval``, ``hilrec record --sim --policy`` and the daemon's rollouts share."""

from __future__ import annotations

from hilrec.daemon.policy.load import (
    TASK_KEY,
    CallablePolicy,
    EvalPolicy,
    LeRobotPolicy,
    Observation,
    Wants,
    as_policy,
    load_policy,
)

__all__ = [
    "TASK_KEY",
    "CallablePolicy",
    "EvalPolicy",
    "LeRobotPolicy",
    "Observation",
    "Wants",
    "as_policy",
    "load_policy",
]
