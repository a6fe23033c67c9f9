"""The ranges of one buffer that point at shared content (`compute/shared_content.py`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from rpcnet.compute.shared_content import SharedContent


@dataclass(eq=False)
class Share:
    start: int
    content: SharedContent
    _window: Any = field(default=None, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.content.nbytes

    @property
    def nbytes(self) -> int:
        return self.content.nbytes

    def window(self) -> Any:
        """The content as a uint8 array addressed by buffer offsets (made once)."""
        if self._window is None:
            content = self.content
            self._window = content.store.backend.window(content.array, self.start)
        return self._window


class SharedRanges:
    """Disjoint shared ranges of a buffer, sorted by start."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._shares: list[Share] = []
        self.nbytes = 0  # bytes of the buffer that point at shared content

    def __len__(self) -> int:
        return len(self._shares)

    def __iter__(self):
        return iter(list(self._shares))

    def overlapping(self, start: int, end: int) -> list[Share]:
        """The shares that overlap [start, end)."""
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        out = []
        while i < len(self._shares) and self._shares[i].start < end:
            share = self._shares[i]
            if share.end > start:
                out.append(share)
            i += 1
        return out

    def containing(self, start: int, end: int) -> Share | None:
        """The share that [start, end) lies wholly inside, if any."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._shares[i].end >= end:
            return self._shares[i]
        return None

    def covered(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) widened over the shares that touch it end to end: the span that shared
        ranges cover without a gap around it (its whole pages hold no bytes of the buffer's
        own)."""
        i = bisect.bisect_left(self._starts, start) - 1
        while i >= 0 and self._shares[i].end == start:
            start = self._shares[i].start
            i -= 1
        i = bisect.bisect_left(self._starts, end)
        while i < len(self._shares) and self._shares[i].start == end:
            end = self._shares[i].end
            i += 1
        return start, end

    def add(self, share: Share) -> None:
        assert not self.overlapping(share.start, share.end), "shared ranges overlap"
        i = bisect.bisect_left(self._starts, share.start)
        self._starts.insert(i, share.start)
        self._shares.insert(i, share)
        self.nbytes += share.nbytes

    def remove(self, share: Share) -> None:
        i = self._shares.index(share)
        del self._starts[i]
        del self._shares[i]
        self.nbytes -= share.nbytes
