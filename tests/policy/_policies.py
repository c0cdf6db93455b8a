"""Policies for the rollout tests, loaded by path (``tests/policy/_policies.py:name``) as
``--policy`` takes them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def hold_still(observation: Mapping[str, Any]) -> np.ndarray:
    """The goal is where the arm is: the policy never moves it."""
    return np.asarray(observation["observation.state"], dtype=np.float32).copy()


def chunk_of_three(observation: Mapping[str, Any]) -> np.ndarray:
    """Three goals at once, each a degree further on the shoulder pan."""
    state = np.asarray(observation["observation.state"], dtype=np.float32)
    return np.stack([state + np.float32(k) * np.eye(6, dtype=np.float32)[0] for k in (1, 2, 3)])


def nan(observation: Mapping[str, Any]) -> np.ndarray:
    return np.full(6, np.nan, dtype=np.float32)


def huge(observation: Mapping[str, Any]) -> np.ndarray:
    return np.full(6, 1e6, dtype=np.float32)


def wrong_shape(observation: Mapping[str, Any]) -> np.ndarray:
    return np.zeros(5, dtype=np.float32)


def raises(observation: Mapping[str, Any]) -> np.ndarray:
    raise RuntimeError("a policy bug")


class BadThenGood:
    """Bad answers, then good ones: NaN, 1e6, a wrong shape, then the arm's own joints."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, observation: Mapping[str, Any]) -> Any:
        self.calls += 1
        bad = {1: np.full(6, np.nan), 2: np.full(6, 1e6), 3: np.zeros((2, 5))}
        if self.calls in bad:
            return bad[self.calls]
        return np.asarray(observation["observation.state"], dtype=np.float32).copy()


def suicide_after_three() -> Any:
    """A policy process that dies by SIGKILL at its fourth answer (as an OOM kill would end it)."""
    calls = [0]

    def act(observation: Mapping[str, Any]) -> np.ndarray:
        calls[0] += 1
        if calls[0] > 3:
            os.kill(os.getpid(), 9)
        return np.asarray(observation["observation.state"], dtype=np.float32).copy()

    return act


suicidal = suicide_after_three()


class Sway:
    """Chunks of ten goals swinging the shoulder pan +-10 degrees around where the arm started."""

    def __init__(self) -> None:
        self.start: np.ndarray | None = None
        self.calls = 0

    def reset(self) -> None:
        self.start = None

    def __call__(self, observation: Mapping[str, Any]) -> np.ndarray:
        state = np.asarray(observation["observation.state"], dtype=np.float32)
        if self.start is None:
            self.start = state.copy()
        self.calls += 1
        chunk = np.repeat(self.start[None, :], 10, axis=0)
        chunk[:, 0] += np.float32(10.0 * np.sin(self.calls / 5.0))
        return chunk
