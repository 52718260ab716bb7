"""A stand-in model that looks at one region of the frame only, in torch: gradients and occlusion alike."""

from __future__ import annotations

import numpy as np

from metavlm_ros.method.prediction import Prediction, VLMBackend

CLASSES = ('animal', 'vegetation', 'object', 'trash')
#: Regions as (top, bottom, left, right) shares of the frame's height and width.
TOP_RIGHT = (0.0, 0.5, 0.5, 1.0)
BOTTOM_LEFT = (0.5, 1.0, 0.0, 0.5)


def region_mask(shape: tuple[int, ...], region: tuple[float, float, float, float]) -> np.ndarray:
    """The pixels of a frame of `shape` (H, W, ...) that lie in `region`."""
    height, width = shape[:2]
    top, bottom, left, right = region
    mask = np.zeros((height, width), bool)
    mask[round(top * height) : round(bottom * height), round(left * width) : round(right * width)] = True
    return mask


class RegionBackend(VLMBackend):
    """A confidence model whose every score is a smooth function of one region's pixels only.

    `pixel_scores` is the torch function (differentiable in the pixels); `predict` answers with it,
    counting the frames it judged, as a served model would be counted.
    """

    kind = 'confidence'
    name = 'fake-region'
    model_id = 'fake-region'
    classes = CLASSES
    batch_size = 8

    def __init__(self, region: tuple[float, float, float, float]) -> None:
        self.region = region
        self.frames_judged = 0

    def pixel_scores(self, pixels):
        import torch

        height, width = pixels.shape[-2:]
        top, bottom, left, right = self.region
        rows = slice(round(top * height), round(bottom * height))
        patch = pixels[..., rows, round(left * width) : round(right * width)]
        # Each class weighs the region's mean colour its own way; the sigmoid keeps the scores in
        # (0, 1), the square makes a pixel's gradient depend on its own value.
        weights = torch.tensor(
            [[0.5, -0.25, 0.25], [-0.5, 0.5, 0.0], [0.25, 0.25, -0.5], [0.4, 0.3, 0.3]], dtype=pixels.dtype
        )
        colour = patch.mean(dim=(-2, -1)) @ weights.T  # (N, classes)
        texture = ((patch / 255.0) ** 2).mean(dim=(1, 2, 3))[:, None]
        return torch.sigmoid((colour - 64.0) / 32.0 + texture)

    def predict(self, frames):
        import torch

        self.frames_judged += len(frames)
        pixels = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).double()
        with torch.no_grad():
            rows = self.pixel_scores(pixels).numpy()
        return [
            Prediction('confidence', dict(zip(self.classes, map(float, row), strict=True))) for row in rows
        ]
