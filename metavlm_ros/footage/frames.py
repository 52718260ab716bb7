"""Frame sources: image files, folders of images, videos and bags (ROS 2, ROS 1), streamed as RGB frames."""

from __future__ import annotations

import dataclasses
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
from metavlm_ros.footage.video import VIDEO_SUFFIXES

__all__ = [
    'BAG_SUFFIXES',
    'IMAGE_SUFFIXES',
    'VIDEO_SUFFIXES',
    'check_png',
    'footage_kind',
    'frame_digest',
    'is_bag_path',
    'is_video_path',
    'iter_frames',
    'load_image',
    'verify_sources',
]

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')
BAG_SUFFIXES = ('.mcap', '.db3', '.bag')  # rosbag2 storage files, ROS 1 bags


def frame_digest(rgb: np.ndarray) -> str:
    """A short sha256 of a frame's shape and pixels: another frame under the same name differs."""
    digest = hashlib.sha256(str(rgb.shape).encode())
    digest.update(np.ascontiguousarray(rgb).tobytes())
    return digest.hexdigest()[:16]


PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def check_png(data: bytes) -> str | None:
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
        problem = check_png(data.tobytes())
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
    """Whether `path` names a bag: a .mcap / .db3 / ROS 1 .bag file or a rosbag2 directory."""
    path = Path(path)
    if path.is_dir():
        return (path / 'metadata.yaml').is_file() or any(
            child.suffix in ('.mcap', '.db3') for child in path.iterdir() if child.is_file()
        )
    return path.suffix.lower() in BAG_SUFFIXES


def is_video_path(path: str | Path) -> bool:
    """Whether `path` names a video file by its suffix (VIDEO_SUFFIXES: what OpenCV's FFmpeg reads)."""
    path = Path(path)
    return path.suffix.lower() in VIDEO_SUFFIXES and not path.is_dir()


def footage_kind(path: str | Path) -> str:
    """What a source is: 'bag', 'video', 'folder' or 'image' (timed footage is a bag or a video)."""
    if is_bag_path(path):
        return 'bag'
    if is_video_path(path):
        return 'video'
    return 'folder' if Path(path).is_dir() else 'image'


def _unknown_type(path: Path) -> InputError:
    return InputError(
        f'{path}: unknown file type {path.suffix or "(no suffix)"}; frames are read from images '
        f'({", ".join(IMAGE_SUFFIXES)}), folders of them, videos ({", ".join(VIDEO_SUFFIXES)}) and bags '
        '(.mcap, .db3, rosbag2 directories, ROS 1 .bag)'
    )


def verify_sources(sources: Sequence[str | Path] | str | Path) -> None:
    """Check the bags and videos among `sources` for damage before any of their frames is used.

    Bags are read whole (checksums, truncation); videos are opened, their first frame and one near
    their announced end decoded.

    Raises:
        BagError: A bag is damaged (checksum mismatch, truncated, unreadable).
        InputError: A video that does not read, holds no frames or is cut short.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    for source in sources:
        if not Path(source).exists():
            continue
        kind = footage_kind(source)
        if kind == 'bag':
            from metavlm_ros.footage.bags import verify_bag

            verify_bag(source)
        elif kind == 'video':
            from metavlm_ros.footage.video import verify_video

            verify_video(source)


def _check_selection(every: int, start: float | None, end: float | None, max_frames: int | None) -> None:
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ParameterError(f'every must be an integer >= 1, got {every!r}')
    if start is not None and start < 0:
        raise ParameterError(f'start must be >= 0 seconds, got {start}')
    if end is not None and start is not None and end < start:
        raise ParameterError(f'end ({end}) must not be before start ({start})')
    if max_frames is not None and max_frames < 0:
        raise ParameterError(f'max_frames must be >= 0, got {max_frames}')


def _decodes(path: Path) -> bool:
    """Whether a file of a suffix not ours is an image all the same (.ppm, .pgm, .exr, no suffix)."""
    try:
        load_image(path)
    except InputError:
        return False
    return True


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
    """Stream frames from image files, folders of images, videos and bags, one at a time.

    Folders are read in sorted file-name order, images only (other files are skipped). Bags are
    .mcap or .db3 files, rosbag2 directories or ROS 1 .bag files; videos any of VIDEO_SUFFIXES.
    Selection: `every` keeps one frame in `every`, counted per source and starting at the first
    frame inside [start, end]; `start` and `end` (seconds, inclusive) select by time since the first
    message of a bag, by presentation time in a video, and by position in a folder, whose i-th image
    (0-based, sorted) counts as i seconds; `max_frames` caps the total number of frames yielded over
    all sources. A frame whose id an earlier source already gave (two folders of the same file names)
    is yielded as '<id>~2' (then ~3, ...): each id names one frame.

    Args:
        sources: Paths (or one path) of images, folders, videos or bags.
        topic: Image topic to read from bags; default the only image topic of each bag.
        every: Keep every n-th frame (n >= 1).
        start: Skip frames before this many seconds after the first bag message.
        end: Stop at frames after this many seconds after the first bag message.
        max_frames: Stop after this many frames in total.

    Yields:
        Frame objects, in source order.

    Raises:
        InputError: A source is missing, of an unknown type, not an image, a folder without images,
            or a video that does not read.
        BagError: A bag is unreadable or lacks the image topic.
        ParameterError: Selection values are invalid.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    _check_selection(every, start, end, max_frames)
    if not sources:
        raise InputError('no frame sources given')
    remaining = max_frames
    seen: set[str] = set()
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
        elif is_video_path(path):
            from metavlm_ros.footage.video import iter_video_frames

            frames = iter_video_frames(path, every=every, start=start, end=end, max_frames=remaining)
        else:
            if path.is_dir():
                files = _folder_images(path)
                if not files:
                    raise InputError(f'{path}: folder holds no images ({", ".join(IMAGE_SUFFIXES)})')
            else:
                if path.suffix.lower() not in IMAGE_SUFFIXES and not _decodes(path):
                    raise _unknown_type(path)
                files = [path]
            frames = _iter_files(files, every=every, start=start, end=end, max_frames=remaining)
        for frame in frames:
            if frame.id in seen:
                # Another source had a frame of this name (two folders of frame_000000.png): an id
                # names one frame, or two frames' records would be read as one's.
                k = 2
                while f'{frame.id}~{k}' in seen:
                    k += 1
                frame = dataclasses.replace(frame, id=f'{frame.id}~{k}')
            seen.add(frame.id)
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
        yield Frame(id=file.stem, rgb=load_image(file), stamp_ns=0, file=str(file), index=index)
        yielded += 1
