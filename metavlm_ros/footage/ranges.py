"""Ground-truth ranges of the synthetic scenes: a per-pixel range map per frame, as a 16-bit PNG on disk
and as a compressedDepth image in bags (footage/bag_reader.py)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

from metavlm_ros.common.errors import BagError, InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.range_maps import decode_ranges_png, encode_ranges_png
from metavlm_ros.footage.bag_format import resolve_bag
from metavlm_ros.footage.bag_reader import RANGES_TOPIC, read_range_pngs
from metavlm_ros.footage.frames import IMAGE_SUFFIXES, PNG_SIGNATURE, is_bag_path, load_image

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
    folder (`metavlm scenes --format png`), a bag frame's message on RANGES_TOPIC with its header stamp
    (`metavlm scenes` bags). Videos carry none. Maps are decoded on each call (a 1920x1080 map is 8 MB
    as float32; callers keep what they need); a bag's are read once, as PNG bytes by stamp."""

    def __init__(self) -> None:
        self._bags: dict[Path, dict[int, bytes]] = {}

    def __call__(self, frame: Frame) -> np.ndarray | None:
        """The frame's range map (float32 metres, its size, inf = open water), or None."""
        height, width = frame.rgb.shape[:2]
        return self.at(frame.file, frame.stamp_ns, size=(width, height))

    def at(
        self, file: str | Path | None, stamp_ns: int = 0, size: tuple[int, int] | None = None
    ) -> np.ndarray | None:
        """The range map of the frame a record names (its `frame_file` and `stamp_ns`), or None.

        Args:
            file: The frame's file: an image, or a bag.
            stamp_ns: The frame's stamp (a bag frame's header stamp).
            size: The frame's (width, height); None reads an image's from its file, and takes a bag's
                map as it is.

        Raises:
            InputError: The map is unreadable, or of another size than its frame; a bag that is
                unreadable (BagError).
        """
        if not file:
            return None
        path = Path(file)
        if is_bag_path(path):
            png = self._bag(path).get(int(stamp_ns))
            if png is None:
                return None
            what = f'{path}: the range map at {stamp_ns}'
            return _sized(decode_ranges_png(png, what), size, what, 'its frame is')
        if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            return None  # videos: no ranges
        map_path = path.parent / RANGES_DIR / f'{path.stem}.png'
        if not map_path.is_file():
            return None
        ranges = load_ranges_png(map_path)
        return _sized(
            ranges, size or _image_size(path), f'{map_path}: range map', f'its frame {path.name} is'
        )

    def _bag(self, path: Path) -> dict[int, bytes]:
        if path not in self._bags:
            try:
                found = resolve_bag(path)  # the directory an older `scenes --out NAME.mcap` wrote
            except BagError:
                return {}  # no such bag: no map, as for an image file
            self._bags[path] = read_range_pngs(found)  # a bag other tools recorded: none, {}
        return self._bags[path]


def _sized(ranges: np.ndarray, size: tuple[int, int] | None, what: str, frame: str) -> np.ndarray:
    """`ranges`, checked to be of the frame's (width, height) where it is known.

    Raises:
        InputError: A map of another size.
    """
    if size is not None and ranges.shape != (size[1], size[0]):
        raise InputError(f'{what} is {ranges.shape[1]}x{ranges.shape[0]}, {frame} {size[0]}x{size[1]}')
    return ranges


def missing_ranges(frame: Frame, lookup: RangeLookup | None = None) -> InputError | None:
    """The one-line error for a frame without a range map, which a search of MR12 over the footage's
    ranges needs (`--water-ranges truth`, a criteria file's `water_ranges: truth`); None where it has one."""
    if (lookup or RangeLookup())(frame) is not None:
        return None
    if frame.file and is_bag_path(Path(frame.file)):
        where = f'at {frame.stamp_ns} (a {RANGES_TOPIC} message of its stamp)'
    else:
        where = f'({RANGES_DIR}/<frame>.png beside it)'
    return InputError(
        f'{frame.file or frame.id}: no range map {where}, which water ranges '
        "'truth' need: the bags and PNG folders `metavlm scenes` writes have them"
    )
