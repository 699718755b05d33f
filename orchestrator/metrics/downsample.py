"""Largest-Triangle-Three-Buckets downsampling (Steinarsson, 2013) for drawing long series: keeps the shape (peaks
and troughs) with a fixed number of points. Plain Python; full data stays stored and exportable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

P = TypeVar("P")


def lttb(points: Sequence[P], threshold: int, x: int = 0, y: int = 1) -> list[P]:
    """Pick `threshold` of `points` (indexable rows; `x`/`y` name the coordinates); first and last always kept."""
    n = len(points)
    if threshold >= n or threshold < 3:
        return list(points)
    sampled = [points[0]]
    bucket = (n - 2) / (threshold - 2)
    a = 0
    for i in range(threshold - 2):
        start = int((i + 1) * bucket) + 1
        end = min(int((i + 2) * bucket) + 1, n)
        # The next bucket's average is the third corner of the triangle.
        nxt = points[start:end] or [points[-1]]
        avg_x = sum(float(p[x]) for p in nxt) / len(nxt)  # type: ignore[index]
        avg_y = sum(float(p[y]) for p in nxt) / len(nxt)  # type: ignore[index]
        lo, hi = int(i * bucket) + 1, int((i + 1) * bucket) + 1
        ax, ay = float(points[a][x]), float(points[a][y])  # type: ignore[index]
        best, best_area = lo, -1.0
        for j in range(lo, hi):
            px, py = float(points[j][x]), float(points[j][y])  # type: ignore[index]
            area = abs((ax - avg_x) * (py - ay) - (ax - px) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        sampled.append(points[best])
        a = best
    sampled.append(points[-1])
    return sampled
