"""Shapes counted from an image's pixels alone, apart from the task's drawing code (the tests' oracle).

Every non-white pixel belongs to a shape; shapes never touch, so each 4-connected component is one shape.
Its kind follows from how much of its bounding box it fills: a square all of it, a circle about pi/4, a
triangle (apex up, base down) about a half.
"""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
from PIL import Image


def components(mask: np.ndarray) -> list[list[tuple[int, int]]]:
    """The 4-connected components of the true pixels of `mask`, each as its (row, col) pixels."""
    seen = np.zeros_like(mask, dtype=bool)
    found = []
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        seen[start] = True
        stack, pixels = [start], []
        while stack:
            r, c = stack.pop()
            pixels.append((int(r), int(c)))
            for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                inside = 0 <= nr < mask.shape[0] and 0 <= nc < mask.shape[1]
                if inside and mask[nr, nc] and not seen[nr, nc]:
                    seen[nr, nc] = True
                    stack.append((nr, nc))
        found.append(pixels)
    return found


def kind_of(pixels: list[tuple[int, int]]) -> str:
    rows, cols = [p[0] for p in pixels], [p[1] for p in pixels]
    box = (max(rows) - min(rows) + 1) * (max(cols) - min(cols) + 1)
    fill = len(pixels) / box
    return "square" if fill > 0.93 else "circle" if fill > 0.68 else "triangle"


def count_kinds(png: bytes) -> Counter[str]:
    """How many shapes of each kind the PNG shows."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    mask = (pixels != 255).any(axis=-1)
    return Counter(kind_of(c) for c in components(mask))
