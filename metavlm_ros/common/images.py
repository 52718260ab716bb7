"""Frames as every layer passes them: RGB uint8 arrays, their conversion, and the size searches work at."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

# The frame conversions live with the codec (one 16-bit rule, one PNG encoder); named here too.
from metavlm_ros.common.codec import encode_png, to_rgb8
from metavlm_ros.common.errors import InputError, ParameterError

__all__ = [
    'UNKNOWN_INPUT_SIDE',
    'WORKING_SIZE_FACTOR',
    'Frame',
    'check_frame',
    'encode_png',
    'parse_working_size',
    'resize_longer_side',
    'to_rgb8',
    'working_size_for',
]


@dataclass(frozen=True)
class Frame:
    """One frame of footage.

    Attributes:
        id: The file stem, or '<bag or video stem>@<stamp_ns>' for a bag message or a video frame.
        rgb: The pixels, uint8, shape (H, W, 3), RGB order, C-contiguous.
        stamp_ns: The message timestamp in nanoseconds, a video frame's presentation time (its
            position in the video); 0 for image files.
        file: The file (image, video or bag) the frame was read from, as given; '' when not read.
        index: The frame's position in that file: its message on the bag topic, its frame in the
            video, its image in the folder (0-based, counted from the start, not from a selection).
    """

    id: str
    rgb: np.ndarray
    stamp_ns: int = 0
    file: str = ''
    index: int = 0


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


def check_frame(frame: Any, *, min_side: int = 1, what: str = 'a frame') -> np.ndarray:
    """The one frame check: `frame` as a C-contiguous RGB uint8 array of shape (H, W, 3).

    Args:
        frame: what a caller was given as a frame.
        min_side: the fewest pixels each side must have (the search needs 2: relations interpolate).
        what: how the message names the frame, e.g. 'frame 3'.

    Raises:
        InputError: not a numpy array, not RGB uint8 (H, W, 3), or smaller than min_side.
    """
    if not isinstance(frame, np.ndarray):
        raise InputError(f'{what} must be a numpy array, got {type(frame).__name__}')
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise InputError(f'{what} must be RGB uint8 of shape (H, W, 3), got {frame.dtype} {frame.shape}')
    if frame.shape[0] < min_side or frame.shape[1] < min_side:
        raise InputError(
            f'{what} is too small: {frame.shape[1]}x{frame.shape[0]} (at least {min_side}x{min_side})'
        )
    return np.ascontiguousarray(frame)
