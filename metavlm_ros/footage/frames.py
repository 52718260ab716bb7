"""Frame sources: image files, folders of images and ROS 2 bags, streamed as RGB uint8 frames."""

from __future__ import annotations

import hashlib
import math
import numbers
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from metavlm_ros.core.errors import InputError, ParameterError

__all__ = [
    'IMAGE_SUFFIXES',
    'UNKNOWN_INPUT_SIDE',
    'WORKING_SIZE_FACTOR',
    'Frame',
    'frame_digest',
    'is_bag_path',
    'iter_frames',
    'load_image',
    'to_rgb8',
    'parse_working_size',
    'resize_longer_side',
    'working_size_for',
    'verify_sources',
]

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')
BAG_SUFFIXES = ('.mcap', '.db3')


@dataclass(frozen=True)
class Frame:
    """One frame of footage.

    Attributes:
        id: The file stem, or '<bag stem>@<stamp_ns>' for a bag message.
        rgb: The pixels, uint8, shape (H, W, 3), RGB order, C-contiguous.
        stamp_ns: The message timestamp in nanoseconds; 0 for image files.
    """

    id: str
    rgb: np.ndarray
    stamp_ns: int = 0


def to_rgb8(image: np.ndarray, order: str = 'bgr') -> np.ndarray:
    """Convert a decoded image of any common layout to RGB uint8, C-contiguous.

    Grayscale becomes three equal channels. A 4-channel image loses its alpha channel (the colour
    channels are kept as they are, not composited: a robot camera frame has no meaningful
    transparency). 16-bit images are reduced to 8 bits by keeping the high byte (value >> 8);
    float images in [0, 1] are scaled by 255.

    Args:
        image: A 2-D (H, W) or 3-D (H, W, C) array, C in {1, 3, 4}.
        order: Channel order of a 3- or 4-channel input, 'bgr' (OpenCV) or 'rgb'.

    Returns:
        The RGB uint8 frame.

    Raises:
        InputError: The array has an unsupported shape or dtype.
    """
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype in (np.float32, np.float64):
        image = np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)
    elif image.dtype == np.int8 or image.dtype == np.int16:
        raise InputError(f'unsupported signed pixel type {image.dtype}')
    elif image.dtype != np.uint8:
        raise InputError(f'unsupported pixel type {image.dtype}')
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim == 2:
        rgb = cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    elif image.ndim == 3 and image.shape[2] in (3, 4):
        rgb = image[:, :, :3]
        if order == 'bgr':
            rgb = rgb[:, :, ::-1]
    else:
        raise InputError(f'unsupported image shape {tuple(image.shape)}')
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise InputError('empty image')
    return np.ascontiguousarray(rgb)


def frame_digest(rgb: np.ndarray) -> str:
    """A short sha256 of a frame's shape and pixels: another frame under the same name differs."""
    digest = hashlib.sha256(str(rgb.shape).encode())
    digest.update(np.ascontiguousarray(rgb).tobytes())
    return digest.hexdigest()[:16]


PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def _check_png(data: bytes) -> str | None:
    """What is wrong with a PNG's chunk structure (length, CRC, the closing IEND), or None."""
    position = len(PNG_SIGNATURE)
    while position + 12 <= len(data):
        length, kind = struct.unpack('>I4s', data[position : position + 8])
        end = position + 12 + length
        if end > len(data):
            break
        if zlib.crc32(data[position + 4 : end - 4]) != struct.unpack('>I', data[end - 4 : end])[0]:
            return f'{kind.decode("latin-1")} chunk checksum mismatch (damaged file)'
        if kind == b'IEND':
            return None
        position = end
    return 'truncated PNG (no IEND chunk)'


def load_image(path: str | Path) -> np.ndarray:
    """Read an image file as an RGB uint8 frame.

    Grayscale, BGRA (alpha dropped) and 16-bit images are converted as described in `to_rgb8`.

    Args:
        path: The image file.

    Returns:
        The frame, uint8, shape (H, W, 3), RGB.

    Raises:
        InputError: The path is missing, a directory, empty, or not a readable image.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f'{path}: no such file')
    if path.is_dir():
        raise InputError(f'{path}: is a directory, not an image')
    if path.stat().st_size == 0:
        raise InputError(f'{path}: empty file')
    # imdecode on the bytes, not imread on the name: it handles non-ASCII paths on every platform.
    data = np.fromfile(str(path), dtype=np.uint8)
    if data[: len(PNG_SIGNATURE)].tobytes() == PNG_SIGNATURE:
        # Checked here so that a damaged PNG gets one line, not libpng's own message on stderr too.
        problem = _check_png(data.tobytes())
        if problem:
            raise InputError(f'{path}: not a readable image ({problem})')
    image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    if image is None or image.size == 0:
        raise InputError(f'{path}: not a readable image')
    try:
        return to_rgb8(image, order='bgr')
    except InputError as exc:
        raise InputError(f'{path}: not a readable image ({exc})') from None


def resize_longer_side(frame: np.ndarray, size: int | None) -> np.ndarray:
    """Shrink a frame so that its longer side is `size` pixels, keeping the aspect ratio.

    Area interpolation is used (the right filter for shrinking). Frames already small enough, and
    `size` None or 0, are returned unchanged; frames are never enlarged.

    Args:
        frame: An (H, W, C) or (H, W) array.
        size: The target length of the longer side.

    Returns:
        The resized frame (the input itself when no resize is needed).
    """
    if not size:
        return frame
    height, width = frame.shape[:2]
    longer = max(height, width)
    if longer <= size:
        return frame
    scale = size / longer
    new_w = max(1, round(width * scale))
    new_h = max(1, round(height * scale))
    return cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA)


#: `auto` working size: the frame's longer side becomes this many times the model's input side.
WORKING_SIZE_FACTOR = 2
#: The input side `auto` assumes when the model is not known where the search runs (a tester whose
#: model sits in the perception node): the largest of the supported families' base models (BLIP's).
UNKNOWN_INPUT_SIDE = 384


def parse_working_size(value: object) -> int | str | None:
    """Read a working-size setting: 'auto', 'full' (or 0 or None: the frame as it is) or pixels.

    Returns:
        'auto', None for the full frame, or the longer side in pixels.

    Raises:
        ParameterError: anything else (a negative, fractional or unknown value).
    """
    if value is None or value == 'full':
        return None
    if value == 'auto':
        return 'auto'
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise ParameterError(f"working size must be 'auto', 'full' or a number of pixels, got {value!r}")
    return int(text) or None


def working_size_for(setting: int | str | None, width: int, height: int, input_side: int = 0) -> int | None:
    """The longer side (pixels) a width x height frame is searched at, or None for the frame as it is.

    `auto` is WORKING_SIZE_FACTOR times the model's input side (UNKNOWN_INPUT_SIDE when 0), raised
    where needed so that the shorter side stays at least the input side (frames wider than 2:1).
    Frames are never enlarged: a size not below the frame's longer side gives None.

    Args:
        setting: as parse_working_size returns it.
        width: frame width.
        height: frame height.
        input_side: the side of the square the model sees (VLMBackend.input_size), 0 if unknown.
    """
    setting = parse_working_size(setting)
    if setting is None:
        return None
    longer, shorter = max(width, height), min(width, height)
    if setting == 'auto':
        side = input_side or UNKNOWN_INPUT_SIDE
        setting = max(WORKING_SIZE_FACTOR * side, math.ceil(side * longer / shorter))
    return int(setting) if setting < longer else None


def is_bag_path(path: str | Path) -> bool:
    """Whether `path` names a ROS 2 bag: a .mcap / .db3 file or a directory with metadata.yaml."""
    path = Path(path)
    if path.is_dir():
        return (path / 'metadata.yaml').is_file() or any(
            child.suffix in BAG_SUFFIXES for child in path.iterdir() if child.is_file()
        )
    return path.suffix.lower() in BAG_SUFFIXES


def verify_sources(sources: Sequence[str | Path] | str | Path) -> None:
    """Check the bags among `sources` whole for damage before any of their frames is used.

    Raises:
        BagError: A bag is damaged (checksum mismatch, truncated, unreadable).
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    for source in sources:
        if Path(source).exists() and is_bag_path(source):
            from metavlm_ros.core.bags import verify_bag

            verify_bag(source)


def _check_selection(every: int, start: float | None, end: float | None, max_frames: int | None) -> None:
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ParameterError(f'every must be an integer >= 1, got {every!r}')
    if start is not None and start < 0:
        raise ParameterError(f'start must be >= 0 seconds, got {start}')
    if end is not None and start is not None and end < start:
        raise ParameterError(f'end ({end}) must not be before start ({start})')
    if max_frames is not None and max_frames < 0:
        raise ParameterError(f'max_frames must be >= 0, got {max_frames}')


def _folder_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def iter_frames(
    sources: Sequence[str | Path] | str | Path,
    *,
    topic: str | None = None,
    every: int = 1,
    start: float | None = None,
    end: float | None = None,
    max_frames: int | None = None,
) -> Iterator[Frame]:
    """Stream frames from image files, folders of images and ROS 2 bags, one at a time.

    Folders are read in sorted file-name order, images only (other files are skipped). Bags are
    .mcap or .db3 files or bag directories. Selection: `every` keeps one frame in `every`, counted
    per source and starting at the first frame inside [start, end]; `start` and `end` (seconds,
    inclusive) select by time since the first message of a bag, and by position in a folder, whose
    i-th image (0-based, sorted) counts as i seconds; `max_frames` caps the total number of frames
    yielded over all sources.

    Args:
        sources: Paths (or one path) of images, folders or bags.
        topic: Image topic to read from bags; default the only image topic of each bag.
        every: Keep every n-th frame (n >= 1).
        start: Skip frames before this many seconds after the first bag message.
        end: Stop at frames after this many seconds after the first bag message.
        max_frames: Stop after this many frames in total.

    Yields:
        Frame objects, in source order.

    Raises:
        InputError: A source is missing, not an image, or a folder without images.
        BagError: A bag is unreadable or lacks the image topic.
        ParameterError: Selection values are invalid.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    _check_selection(every, start, end, max_frames)
    if not sources:
        raise InputError('no frame sources given')
    remaining = max_frames
    for source in sources:
        if remaining is not None and remaining <= 0:
            return
        path = Path(source)
        if not path.exists() and path.suffix.lower() in BAG_SUFFIXES:
            from metavlm_ros.core.bags import resolve_bag

            path = resolve_bag(path)  # the directory an older `scenes --out NAME.mcap` wrote
        if not path.exists():
            raise InputError(f'{path}: no such file or directory')
        if is_bag_path(path):
            from metavlm_ros.core.bags import iter_bag_frames  # imported late: bags pull in rosbags

            frames = iter_bag_frames(
                path, topic=topic, every=every, start=start, end=end, max_frames=remaining
            )
        else:
            if path.is_dir():
                files = _folder_images(path)
                if not files:
                    raise InputError(f'{path}: folder holds no images ({", ".join(IMAGE_SUFFIXES)})')
            else:
                files = [path]
            frames = _iter_files(files, every=every, start=start, end=end, max_frames=remaining)
        for frame in frames:
            yield frame
            if remaining is not None:
                remaining -= 1


def _iter_files(
    files: list[Path], *, every: int, start: float | None, end: float | None, max_frames: int | None
) -> Iterator[Frame]:
    # Image files carry no time: position i counts as i seconds, so start/end select by index.
    yielded = 0
    eligible = 0
    for index, file in enumerate(files):
        if max_frames is not None and yielded >= max_frames:
            return
        if start is not None and index < start:
            continue
        if end is not None and index > end:
            return
        eligible += 1
        if (eligible - 1) % every:
            continue
        yield Frame(id=file.stem, rgb=load_image(file), stamp_ns=0)
        yielded += 1
