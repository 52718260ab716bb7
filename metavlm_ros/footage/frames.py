"""Frame sources: image files, folders of images and ROS 2 bags, streamed as RGB uint8 frames."""

from __future__ import annotations

import hashlib
import numbers
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import Frame, to_rgb8

__all__ = [
    'IMAGE_SUFFIXES',
    'frame_digest',
    'is_bag_path',
    'iter_frames',
    'load_image',
    'verify_sources',
]

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')
BAG_SUFFIXES = ('.mcap', '.db3')


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
            from metavlm_ros.footage.bags import verify_bag

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
            from metavlm_ros.footage.bags import resolve_bag

            path = resolve_bag(path)  # the directory an older `scenes --out NAME.mcap` wrote
        if not path.exists():
            raise InputError(f'{path}: no such file or directory')
        if is_bag_path(path):
            from metavlm_ros.footage.bags import iter_bag_frames

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
