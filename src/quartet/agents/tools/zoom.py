"""The built-in `zoom` tool: a rectangle of one of the prompt's images, enlarged, shown back to the model.

    <tool_call>{"name": "zoom", "arguments": {"x0": 28, "y0": 0, "x1": 56, "y1": 28}}</tool_call>
    -> a tool message "image 0, box (28, 0)-(56, 28), enlarged 2x" and the crop as an image

It is the smallest tool that returns an image (`ToolResult.images`), and a useful one for the built-in
`shapes` task (`quartet.tasks.shapes`): its 84 x 84 picture is a 3 x 3 grid of 28-pixel cells, so a cell
box such as (28, 0)-(56, 28) shows one shape at twice the size, four image tokens instead of one. The
tool `wants_images`: the loop gives each trajectory's instance the prompt's encoded images. The box is in
the image's own pixels (x0, y0 inclusive, x1, y1 exclusive); the crop is enlarged `scale` times with
nearest-neighbour sampling (crisp edges, no new colours), its longer side capped at `max_side`.

Bad arguments are answered, never raised: a box outside the image, empty or inverted, an image index the
prompt does not have, a row without images or an image Pillow cannot read give an error result (the box's
naming the image's size).
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

from quartet.agents.tools.base import Tool, ToolResult

__all__ = ["ZoomTool"]

_COORD = {"type": "integer", "minimum": 0}


class ZoomTool(Tool):
    """Crop and enlarge a rectangle of a prompt image (module docstring)."""

    wants_images = True
    schema = {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": (
                "Show a rectangle of an image of the question enlarged. The box is in the image's pixels: "
                "(x0, y0) its top-left corner, (x1, y1) just past its bottom-right corner."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "x0": _COORD,
                    "y0": _COORD,
                    "x1": _COORD,
                    "y1": _COORD,
                    "image": {"type": "integer", "minimum": 0, "description": "which image, 0 the first"},
                },
                "required": ["x0", "y0", "x1", "y1"],
                "additionalProperties": False,
            },
        },
    }

    def __init__(self, scale: int = 2, max_side: int = 448, schema: dict[str, Any] | None = None) -> None:
        """scale: how many times the crop is enlarged (1-8); max_side: longest side of the result, pixels."""
        if not 1 <= scale <= 8:
            raise ValueError(f"scale must be 1..8, got {scale}")
        if max_side < 28:
            raise ValueError(f"max_side must be >= 28 pixels, got {max_side}")
        super().__init__(schema=schema)
        self.scale = scale
        self.max_side = max_side

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        images = list(self.instances.get(instance_id, {}).get("images") or [])
        index = int(arguments.get("image", 0))
        if not images:
            return _error("the question has no image to zoom into")
        if index >= len(images):
            return _error(f"image {index} does not exist: the question has {len(images)} image(s), 0..")
        box = tuple(int(arguments[k]) for k in ("x0", "y0", "x1", "y1"))
        return await asyncio.to_thread(self._zoom, bytes(images[index]), index, box)

    def _zoom(self, blob: bytes, index: int, box: tuple[int, ...]) -> ToolResult:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(blob)) as opened:
                image = opened.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            return _error(f"image {index} cannot be read ({type(err).__name__})")
        x0, y0, x1, y1 = box
        width, height = image.size
        if not (x0 < x1 <= width and y0 < y1 <= height):
            return _error(
                f"the box ({x0}, {y0})-({x1}, {y1}) is not inside image {index} of {width} x {height} pixels "
                "with x0 < x1 and y0 < y1"
            )
        crop = image.crop((x0, y0, x1, y1))
        factor = min(float(self.scale), self.max_side / max(crop.size))
        size = (max(1, round(crop.width * factor)), max(1, round(crop.height * factor)))
        out = io.BytesIO()
        crop.resize(size, Image.Resampling.NEAREST).save(out, "PNG")
        text = f"image {index}, box ({x0}, {y0})-({x1}, {y1}), enlarged {factor:g}x"
        return ToolResult(text=text, images=(out.getvalue(),))


def _error(problem: str) -> ToolResult:
    return ToolResult(text=f"Error: {problem}", error=problem)
