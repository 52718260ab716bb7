"""Video files (mp4, mkv, avi, mov, ...) through OpenCV's FFmpeg: streamed, checked and written."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import Frame
from metavlm_ros.footage.bag_format import DEFAULT_START_NS

__all__ = [
    'VIDEO_EPOCH_NS',
    'VIDEO_SUFFIXES',
    'WRITE_CODECS',
    'iter_video_frames',
    'open_video',
    'verify_video',
    'video_rate',
    'write_video',
]

#: What a video file may end in: containers OpenCV's FFmpeg demuxes.
VIDEO_SUFFIXES = ('.mp4', '.m4v', '.mov', '.mkv', '.webm', '.avi', '.mpg', '.mpeg')
#: Where a video's frames are stamped when published on ROS topics (metavlm replay, metavlm run): this
#: instant plus their presentation time. A video's time 0 is 'no stamp' in ROS; a fixed instant (the
#: one scene bags start at, 2026-01-01T00:00:00Z) keeps a frame's position in its stamp (stamp - epoch)
#: and gives a frame the same stamp in every run, so a tester resumes on it.
VIDEO_EPOCH_NS = DEFAULT_START_NS
#: The codec `write_video` uses per container: those OpenCV's own FFmpeg build encodes everywhere.
WRITE_CODECS = {'.mp4': 'mp4v', '.m4v': 'mp4v', '.mov': 'mp4v', '.mkv': 'MJPG', '.avi': 'MJPG'}


# FFmpeg prints its own lines (moov atom not found, File ended prematurely) straight to stderr; a
# damaged video is one line of ours. OpenCV reads this once, when FFmpeg is first used in the
# process, so it is set on import (frames.py imports this module), before any video is opened or
# written; a user's own setting wins.
os.environ.setdefault('OPENCV_FFMPEG_LOGLEVEL', '-8')


@contextmanager
def _opencv_silent() -> Iterator[None]:
    """OpenCV's own warnings (backend cannot capture by name) off while a video is opened or written."""
    previous = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(previous)


@contextmanager
def open_video(path: str | Path) -> Iterator[Any]:
    """A video file opened for reading (a cv2.VideoCapture on FFmpeg), released at the end.

    Raises:
        InputError: No such file, an empty file, or one FFmpeg cannot read as a video.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f'{path}: no such file')
    if path.stat().st_size == 0:
        raise InputError(f'{path}: empty file')
    with _opencv_silent():
        capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    try:
        if not capture.isOpened():
            raise InputError(f'{path}: not a readable video (unknown format, or a damaged or truncated file)')
        yield capture
    finally:
        capture.release()


def video_rate(path: str | Path) -> float:
    """A video's frame rate (frames per second) as its container states it; 0 when it states none.

    Raises:
        InputError: see open_video.
    """
    with open_video(path) as capture:
        fps = float(capture.get(cv2.CAP_PROP_FPS))
    return fps if math.isfinite(fps) and fps > 0 else 0.0


def _announced(capture: Any) -> int:
    count = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    return int(count) if math.isfinite(count) and count > 0 else 0


def _slack(announced: int) -> int:
    # Containers that store no frame count (mkv, webm) have it estimated from duration x rate.
    return max(2, announced // 100)


def verify_video(path: str | Path) -> None:
    """Check a video before any of its frames is used: it opens, holds a frame, and its last frames decode.

    Only the first frame and one near the end (a seek) are decoded, so an hour of video is checked in
    a moment; damage in between that FFmpeg conceals is not seen.

    Raises:
        InputError: Not a readable video, no frames, or cut short of the frames it announces.
    """
    with open_video(path) as capture:
        if not capture.grab():
            raise InputError(f'{path}: the video holds no frames')
        announced = _announced(capture)
        last = announced - 1 - _slack(announced)
        if last > 0:
            capture.set(cv2.CAP_PROP_POS_FRAMES, last)
            if not capture.grab():
                raise InputError(
                    f'{path}: truncated or damaged video ({announced} frames announced, '
                    f'frame {last} does not decode)'
                )


def iter_video_frames(
    path: str | Path,
    *,
    every: int = 1,
    start: float | None = None,
    end: float | None = None,
    max_frames: int | None = None,
) -> Iterator[Frame]:
    """Stream a video's frames in order, one decoded at a time, with their presentation times.

    Args:
        path: The video file.
        every: Keep every n-th frame of the selected time window.
        start: Skip frames presented before this many seconds (the video is seeked, not decoded, there).
        end: Stop after frames presented later than this many seconds.
        max_frames: Stop after this many frames.

    Yields:
        Frame with id '<video stem>@<stamp_ns>', stamp_ns the presentation time (the position in the
        video, from 0), file the video and index the frame number.

    Raises:
        InputError: Not a readable video, no frames, or one that ends before the frames it announces.
        ParameterError: every < 1.
    """
    if every < 1:
        raise ParameterError(f'every must be an integer >= 1, got {every!r}')
    path = Path(path)
    first_ns = None if start is None else round(start * 1e9)
    last_ns = None if end is None else round(end * 1e9)
    if max_frames is not None and max_frames <= 0:
        return
    with open_video(path) as capture:
        announced = _announced(capture)
        fps = float(capture.get(cv2.CAP_PROP_FPS))
        index = 0
        if start and math.isfinite(fps) and fps > 0:
            # A frame early: frames are then chosen by their presentation time, not by the seek.
            target = max(0, math.floor(start * fps) - 1)
            if target and capture.set(cv2.CAP_PROP_POS_FRAMES, target):
                index = int(capture.get(cv2.CAP_PROP_POS_FRAMES))
        position = yielded = grabbed = 0
        while True:
            if not capture.grab():
                break
            grabbed += 1
            frame_index, index = index, index + 1
            stamp = round(capture.get(cv2.CAP_PROP_POS_MSEC) * 1e6)
            if first_ns is not None and stamp < first_ns:
                continue
            if last_ns is not None and stamp > last_ns:
                return
            keep = position % every == 0
            position += 1
            if not keep:
                continue
            ok, bgr = capture.retrieve()
            if not ok or bgr is None:
                raise InputError(f'{path}: frame {frame_index} does not decode (damaged video)')
            rgb = np.ascontiguousarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            yield Frame(id=f'{path.stem}@{stamp}', rgb=rgb, stamp_ns=stamp, file=str(path), index=frame_index)
            yielded += 1
            if max_frames is not None and yielded >= max_frames:
                return
        if grabbed == 0 and index == 0:
            raise InputError(f'{path}: the video holds no frames')
        if announced and index < announced - _slack(announced):
            raise InputError(
                f'{path}: truncated or damaged video ({announced} frames announced, '
                f'decoding stops at frame {index})'
            )


def write_video(
    path: str | Path, frames: Iterable[np.ndarray], *, fps: float, overwrite: bool = False
) -> Path:
    """Write RGB frames as a video (codec by container: WRITE_CODECS), one frame at a time.

    The file appears under `path` only when complete.

    Raises:
        InputError: The output exists (without overwrite), or a frame is not RGB uint8 of the first's size.
        ParameterError: An unknown container, invalid fps, or an odd width or height.
        OSError: The file cannot be written.
    """
    from metavlm_ros.common.scratch import remove_stale, scratch_path

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WRITE_CODECS:
        raise ParameterError(
            f'{path}: cannot write {suffix or "that"} video; write {", ".join(WRITE_CODECS)}'
        )
    if not fps or fps <= 0:
        raise ParameterError(f'fps must be > 0, got {fps}')
    if path.exists() and not overwrite:
        raise InputError(f'{path}: already exists (use --overwrite to replace it)')
    if path.exists() and not path.is_file():
        raise InputError(f'{path}: exists and is not a file; refusing to replace it')
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent, path.name)
    tmp = scratch_path(path, suffix)  # FFmpeg picks the container by the suffix
    writer = None
    try:
        size = None
        for index, rgb in enumerate(frames):
            if not (
                isinstance(rgb, np.ndarray) and rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
            ):
                raise InputError(f'frame {index}: expected an RGB uint8 (H, W, 3) array')
            if writer is None:
                size = (rgb.shape[1], rgb.shape[0])
                if size[0] % 2 or size[1] % 2:
                    # 4:2:0 chroma: FFmpeg would drop the odd row and column without a word.
                    raise ParameterError(
                        f'{path}: a video needs an even width and height, got {size[0]}x{size[1]}'
                    )
                with _opencv_silent():
                    writer = cv2.VideoWriter(
                        str(tmp), cv2.VideoWriter_fourcc(*WRITE_CODECS[suffix]), fps, size
                    )
                if not writer.isOpened():
                    raise OSError(
                        f'cannot write {tmp.name} ({WRITE_CODECS[suffix]} codec unavailable or disk)'
                    )
            elif (rgb.shape[1], rgb.shape[0]) != size:
                raise InputError(f'frame {index}: {rgb.shape[1]}x{rgb.shape[0]}, not {size[0]}x{size[1]}')
            writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        if writer is None:
            raise InputError(f'{path}: no frames to write')
        writer.release()
        writer = None
        # OpenCV's writer reports no failed write (a full disk): the video is read back before it counts.
        try:
            verify_video(tmp)
        except InputError:
            raise OSError(f'the written video does not read back ({tmp.stat().st_size} bytes)') from None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.release()
        tmp.unlink(missing_ok=True)
    return path
