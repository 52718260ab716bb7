"""Ground-truth ranges of the synthetic scenes: a per-pixel range map per frame, on disk as a 16-bit PNG."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.range_maps import decode_ranges_png, encode_ranges_png
from metavlm_ros.footage.frames import IMAGE_SUFFIXES, PNG_SIGNATURE, load_image

if TYPE_CHECKING:  # the lookup needs no scene: searches of footage on disk import it
    from metavlm_ros.footage.scenes import SceneGenerator
    from metavlm_ros.footage.truth import GroundTruth

__all__ = [
    'RANGES_DIR',
    'RangeLookup',
    'load_ranges_png',
    'missing_ranges',
    'render_with_ranges',
    'scene_ranges',
    'write_ranges_png',
]

#: The subfolder of a scenes folder (`metavlm scenes --format png`) holding each frame's range map,
#: under the frame's file name: frame_000000.png's is ranges/frame_000000.png. Surfaces farther than
#: 65.534 m (the floor next to the horizon; common/range_maps.py's MAX_MILLIMETRES) are written as
#: 65.534 m and read back as that.
RANGES_DIR = 'ranges'


def scene_ranges(generator: SceneGenerator, index: int, labels: np.ndarray) -> np.ndarray:
    """The range of every pixel of frame `index` of a scene: what `generator.render(index)` drew there.

    A pixel's range is the scene's own distance `d`, the one its colour was attenuated over: the
    floor's and the pool wall's (`surface_d`, seen through the camera's motion as `render` sees the
    panorama), or that of the object `labels` marks there. The camera looks level, so `d` is the
    distance ahead of it (along the optical axis); an off-centre ray is longer by
    sqrt(1 + x^2 + y^2) in focal units, which the scene leaves out as this map does. Pixels sample
    the nearest panorama point (a blend would make ranges that no surface has), and the map is
    resized to the output size by nearest neighbour, so an object's pixels carry exactly its `d`.

    Args:
        generator: The scene.
        index: The frame number.
        labels: The label map `generator.render(index)` returned with the frame (internal size).

    Returns:
        float32 (height, width) at the generator's output size, metres; np.inf where open water is
        seen (no surface: above the horizon, above the pool wall).

    Raises:
        ParameterError: `labels` is not of the generator's internal size.
    """
    iw, ih = generator.internal_size
    if labels.shape != (ih, iw):
        raise ParameterError(f'labels of shape {labels.shape}, not the scene internal size {iw}x{ih}')
    panorama = np.where(generator.ground_mask, generator.surface_d, np.inf).astype(np.float32)
    map_x, map_y = generator.camera_maps(index)
    ranges = cv2.remap(panorama, map_x, map_y, cv2.INTER_NEAREST, borderMode=cv2.BORDER_REFLECT)
    seen = labels >= 0
    if seen.any():
        distance = np.full(max(o.index for o in generator.objects) + 1, np.nan, np.float32)
        for obj in generator.objects:
            distance[obj.index] = obj.d
        ranges[seen] = distance[labels[seen]]
    if (iw, ih) != (generator.width, generator.height):
        ranges = cv2.resize(ranges, (generator.width, generator.height), interpolation=cv2.INTER_NEAREST)
    return ranges


def render_with_ranges(generator: SceneGenerator, index: int) -> tuple[np.ndarray, GroundTruth, np.ndarray]:
    """Frame `index` as (rgb, ground truth, ranges) from one `render`: `generator.frame(index)` and
    `scene_ranges` of it."""
    rgb, truth, labels = generator.render(index)
    return rgb, truth, scene_ranges(generator, index, labels)


def write_ranges_png(path: str | Path, ranges: np.ndarray) -> Path:
    """Write a range map (float32 metres, inf where no surface) to `path` as a 16-bit PNG of millimetres
    (common/range_maps.py: rounded, 0 = no surface, beyond 65.534 m written as 65534); returns the path.

    Raises:
        InputError: The map is not 2-D.
        OSError: The file cannot be written (a full disk is this, not a silent failure).
    """
    path = Path(path)
    path.write_bytes(encode_ranges_png(ranges))
    return path


def load_ranges_png(path: str | Path) -> np.ndarray:
    """Read a range map `write_ranges_png` wrote: float32 metres, np.inf where it holds 0 (open water).

    Raises:
        InputError: The file is missing, or not a 16-bit single-channel PNG (one line naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f'{path}: no such range map')
    return decode_ranges_png(path.read_bytes(), f'{path}')


def _image_size(path: Path) -> tuple[int, int]:
    """(width, height) of an image file: a PNG's from its header, any other image's decoded."""
    with open(path, 'rb') as file:
        head = file.read(24)
    if head[: len(PNG_SIGNATURE)] == PNG_SIGNATURE and head[12:16] == b'IHDR':
        return struct.unpack('>II', head[16:24])
    height, width = load_image(path).shape[:2]
    return width, height


class RangeLookup:
    """Finds each frame's ground-truth range map: an image frame's `ranges/<its stem>.png` in its
    folder (`metavlm scenes --format png`). Bags and videos carry none yet. Maps are read on each call
    (a 1920x1080 map is 8 MB as float32; callers keep what they need)."""

    def __call__(self, frame: Frame) -> np.ndarray | None:
        """The frame's range map (float32 metres, its size, inf = open water), or None."""
        height, width = frame.rgb.shape[:2]
        return self.at(frame.file, frame.stamp_ns, size=(width, height))

    def at(
        self, file: str | Path | None, stamp_ns: int = 0, size: tuple[int, int] | None = None
    ) -> np.ndarray | None:
        """The range map of the frame a record names (its `frame_file` and `stamp_ns`), or None.

        Args:
            file: The frame's file.
            stamp_ns: The frame's stamp (bags; unused until they carry ranges).
            size: The frame's (width, height); None reads it from the file.

        Raises:
            InputError: The map is unreadable, or of another size than its frame.
        """
        if not file:
            return None
        path = Path(file)
        if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            return None  # bags and videos: no ranges yet
        map_path = path.parent / RANGES_DIR / f'{path.stem}.png'
        if not map_path.is_file():
            return None
        ranges = load_ranges_png(map_path)
        width, height = size if size is not None else _image_size(path)
        if ranges.shape != (height, width):
            raise InputError(
                f'{map_path}: range map is {ranges.shape[1]}x{ranges.shape[0]}, its frame {path.name} is '
                f'{width}x{height}'
            )
        return ranges


def missing_ranges(frame: Frame, lookup: RangeLookup | None = None) -> InputError | None:
    """The one-line error for a frame without a range map, which a search of MR12 over the footage's
    ranges needs (`--water-ranges truth`, a criteria file's `water_ranges: truth`); None where it has one."""
    if (lookup or RangeLookup())(frame) is not None:
        return None
    return InputError(
        f'{frame.file or frame.id}: no range map (ranges/<frame>.png beside it), which water ranges '
        "'truth' need: footage `metavlm scenes --format png` wrote has them"
    )
