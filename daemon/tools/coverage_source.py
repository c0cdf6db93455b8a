"""``hilrec coverage ROOT --by-source``: a rollout's frames split by who drove them.

A rollout dataset (``hilrec rollout``, ``hilrec record --sim --policy``) carries the per-frame
``intervention`` column: true where the human (or the scripted expert) drove. Split by it, the
human's frames are measured as the data and the policy's as the test states, so the test
coverage says how much of where the policy went the human's corrections reach, and the farthest
states name the episode and frame where the policy went that nobody has shown it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hilrec.daemon.dataset import load_episodes, load_info, read_episode
from hilrec.daemon.errors import FlagError
from hilrec.daemon.policy.record import INTERVENTION_KEY
from hilrec.daemon.so101 import STATE_KEY, joint_names
from hilrec.daemon.tools.coverage import States, dataset_arms


def source_states(root: Path) -> tuple[States, States]:
    """The human's states and the policy's, each with the episode and frame of every run."""
    if INTERVENTION_KEY not in (load_info(root).get("features") or {}):
        raise FlagError(
            "--by-source",
            f"{root} has no {INTERVENTION_KEY!r} column: it is not a rollout's (hilrec rollout records one)",
        )
    names = joint_names(dataset_arms(root))
    human = States(values=np.empty((0, len(names))), origin=[], names=names)
    policy = States(values=np.empty((0, len(names))), origin=[], names=names)
    runs: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for row in load_episodes(root):
        index = int(row["episode_index"])
        rows = read_episode(root, index, [STATE_KEY, INTERVENTION_KEY])
        values = rows[STATE_KEY].astype(np.float64)
        by_human = rows[INTERVENTION_KEY].reshape(len(values), -1)[:, 0].astype(bool)
        for states, chunks, mask in ((human, runs[0], by_human), (policy, runs[1], ~by_human)):
            if not mask.any():
                continue
            states.episodes += 1
            # One origin per run of frames, so a state's frame is its frame in the episode.
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
            for start, stop in zip(edges[::2], edges[1::2], strict=True):
                states.origin.append(("episode", index, sum(len(c) for c in chunks)))
                states.first_frames.append(int(start))
                chunks.append(values[start:stop])
    for states, chunks, who in ((human, runs[0], "a human"), (policy, runs[1], "the policy")):
        if not chunks:
            raise FlagError("--by-source", f"{root}: no frame was driven by {who}; nothing to compare")
        states.values = np.concatenate(chunks)
    return human, policy
