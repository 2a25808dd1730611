"""Chart labels that do not overlap: a greedy placement beside each point, checked against nearby labels only."""
from __future__ import annotations

import math
from collections.abc import Sequence


def overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when boxes ``(x0, y0, x1, y1)`` ``a`` and ``b`` share area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(anchors: Sequence[tuple[float, float]], widths: Sequence[float], height: float,
                 bounds: tuple[float, float, float, float]) -> list[tuple[float, float]]:
    """Greedy, deterministic label placement: each label's box goes at the first spot around its anchor
    (right-above, right-below, left-above, left-below, then the same one and two lines further out) that overlaps
    no label placed before it and stays inside ``bounds``; where none is free, right-above.

    The boxes placed so far are kept in a grid of cells as wide as the widest label and one label high, so a spot is
    checked only against the boxes in the (at most four) cells it touches: the work grows with the number of
    labels times the labels that crowd one place, not with the square of the number of labels.

    Args:
        anchors: the points labelled, in points (1/72 inch) on the figure, in placement order.
        widths: each label's width in points.
        height: the labels' height in points.
        bounds: ``(x0, y0, x1, y1)`` of the axes in points.
    Returns:
        The offset of each label box's lower-left corner from its anchor, in points.
    """
    cell_w, cell_h = max([*widths, 1.0]), max(height, 1.0)
    grid: dict[tuple[int, int], list[tuple[float, float, float, float]]] = {}

    def cells(b: Sequence[float]) -> list[tuple[int, int]]:
        return [(i, j) for i in range(math.floor(b[0] / cell_w), math.floor(b[2] / cell_w) + 1)
                for j in range(math.floor(b[1] / cell_h), math.floor(b[3] / cell_h) + 1)]

    def free(b: Sequence[float]) -> bool:
        inside = b[0] >= bounds[0] and b[2] <= bounds[2] and b[1] >= bounds[1] and b[3] <= bounds[3]
        return inside and not any(overlaps(b, p) for c in cells(b) for p in grid.get(c, ()))

    offsets = []
    for (x, y), w in zip(anchors, widths):
        spots = [(dx, dy) for k in range(3)  # four spots beside the point, then the same a line further out
                 for dx, dy in ((4.0, 3.0 + k * height), (4.0, -3.0 - (k + 1) * height),
                                (-4.0 - w, 3.0 + k * height), (-4.0 - w, -3.0 - (k + 1) * height))]
        boxes = [(x + dx, y + dy, x + dx + w, y + dy + height) for dx, dy in spots]
        i = next((i for i, b in enumerate(boxes) if free(b)), 0)
        for c in cells(boxes[i]):
            grid.setdefault(c, []).append(boxes[i])
        offsets.append(spots[i])
    return offsets
