"""The ``--episodes`` flag (``1,4-6``): ranges kept as ranges until the dataset bounds them.

``--episodes 0-10000000`` once became a list of ten million numbers (945 MB) and an error that
printed them all (89 MB). :class:`EpisodeRanges` keeps the spans as written; :meth:`within`
refuses a span that leaves the dataset, naming the valid range, before anything is expanded.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hilrec.daemon.errors import DatasetError

SHOWN: int = 5  # episodes named in an error, at most


@dataclass(frozen=True)
class EpisodeRanges:
    """Inclusive spans ``(first, last)`` in the order given, and the text they came from."""

    spans: tuple[tuple[int, int], ...]
    text: str

    def __iter__(self) -> Iterator[int]:
        for first, last in self.spans:
            yield from range(first, last + 1)

    def within(self, count: int, root: Path, flag: str = "--episodes") -> list[int]:
        """The episodes, sorted and distinct, once every span is inside ``0 .. count - 1``."""
        for _first, last in self.spans:
            if last >= count:
                have = f"episodes 0-{count - 1}" if count else "no episode"
                raise DatasetError(f"{root}: {flag} {self.text}: no episode {last} (the dataset has {have})")
        return sorted({e for first, last in self.spans for e in range(first, last + 1)})


def parse_episodes(text: str) -> EpisodeRanges:
    """``1,4-6`` -> spans (1, 1), (4, 6)."""
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        first_text, dash, last_text = part.strip().partition("-")
        try:
            first = int(first_text)
            last = int(last_text) if dash else first
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected episode numbers such as 1,4-6, got {text!r}"
            ) from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} in {text!r} is not a range first-last")
        spans.append((first, last))
    return EpisodeRanges(tuple(spans), text)


def episode_list(episodes: Iterable[int], count: int, root: Path, flag: str = "--episodes") -> list[int]:
    """``episodes`` (ranges from the flag, or plain numbers) sorted and distinct, each an
    episode of a dataset of ``count``; an error names at most :data:`SHOWN` that are not."""
    if isinstance(episodes, EpisodeRanges):
        return episodes.within(count, root, flag)
    wanted = sorted({int(e) for e in episodes})
    unknown = [e for e in wanted if not 0 <= e < count]
    if unknown:
        more = f" and {len(unknown) - SHOWN} more" if len(unknown) > SHOWN else ""
        have = f"episodes 0-{count - 1}" if count else "no episode"
        raise DatasetError(f"{root}: {flag}: no episode {unknown[:SHOWN]}{more} (the dataset has {have})")
    return wanted


def ranges_text(episodes: Iterable[int]) -> str:
    """Episodes as the flag spells them: [0, 1, 2, 5] -> ``0-2,5``."""
    if isinstance(episodes, EpisodeRanges):
        return episodes.text
    parts: list[str] = []
    wanted = sorted({int(e) for e in episodes})
    start = prev = None
    for e in [*wanted, None]:
        if e is not None and prev is not None and e == prev + 1:
            prev = e
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = e
    return ",".join(parts)
