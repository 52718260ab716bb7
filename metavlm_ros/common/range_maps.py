"""Range maps on disk: a frame's range to the scene per pixel as a 16-bit PNG of millimetres.

The depth-image convention of ROS (REP 118's 16UC1) and of RGB-D data sets: one unsigned 16-bit value
per pixel, the range in millimetres, 0 where there is no surface (open water: the range is infinite).
Ranges beyond 65.534 m are stored as 65534 mm (no scene a camera sees through water is that far).
In memory a map is float32 metres, (H, W), inf where there is no surface.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError, ResultsError

__all__ = [
    'MAX_MILLIMETRES',
    'decode_ranges_png',
    'encode_ranges_png',
    'quantise_ranges',
    'ranges_digest',
    'read_source_ranges',
]

#: The largest range a map stores, mm (65535 is left unused, 0 means no surface).
MAX_MILLIMETRES = 65534


def _millimetres(ranges: np.ndarray) -> np.ndarray:
    ranges = np.asarray(ranges, dtype=np.float64)
    if ranges.ndim != 2:
        raise InputError(f'a range map is (H, W), got shape {ranges.shape}')
    surface = np.isfinite(ranges) & (ranges > 0.0)
    mm = np.rint(np.where(surface, ranges, 0.0) * 1000.0)
    # A surface nearer than half a millimetre still is one: 1 mm, never 0 (no surface).
    mm = np.where(surface, np.clip(mm, 1, MAX_MILLIMETRES), 0)
    return mm.astype(np.uint16)


def _metres(mm: np.ndarray) -> np.ndarray:
    ranges = mm.astype(np.float32) / np.float32(1000.0)
    ranges[mm == 0] = np.inf
    return ranges


def quantise_ranges(ranges: np.ndarray) -> np.ndarray:
    """A range map as its PNG holds it: metres rounded to millimetres, float32, inf without a surface
    (NaN and values <= 0 too): what a search uses, so that a stored map renders its follow-ups again."""
    return _metres(_millimetres(ranges))


def encode_ranges_png(ranges: np.ndarray) -> bytes:
    """A range map (metres) as the bytes of a 16-bit PNG of millimetres.

    Raises:
        InputError: not a 2-D map, or OpenCV could not encode it.
    """
    ok, data = cv2.imencode('.png', _millimetres(ranges))
    if not ok:
        raise InputError('the range map could not be encoded as PNG')
    return data.tobytes()


def decode_ranges_png(data: bytes, what: str = 'the range map') -> np.ndarray:
    """The range map (float32 metres, inf without a surface) of a 16-bit PNG of millimetres.

    Raises:
        InputError: the bytes are not a single-channel 16-bit PNG.
    """
    mm = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if mm is None or mm.dtype != np.uint16 or mm.ndim != 2:
        raise InputError(f'{what} is not a single-channel 16-bit PNG of millimetres')
    return _metres(mm)


def ranges_digest(ranges: np.ndarray) -> str:
    """The sha256 (hex) of a range map's shape and millimetres: what names and checks a stored map."""
    mm = _millimetres(ranges)
    digest = hashlib.sha256(('ranges' + str(mm.shape)).encode())
    digest.update(np.ascontiguousarray(mm).tobytes())
    return digest.hexdigest()


def read_source_ranges(directory: str | Path, summary: dict) -> np.ndarray | None:
    """The range map a finished search used (its summary's `source_ranges`), checked against its
    sha256; None where the search used none.

    Raises:
        ResultsError: the file is missing, damaged or holds another map.
    """
    relative, expected = summary.get('source_ranges'), summary.get('source_ranges_sha256')
    if not relative:
        return None
    path = Path(directory) / relative
    what = f'the range map of the search of {summary.get("image")}'
    if not path.is_file():
        raise ResultsError(f'{path}: {what} is missing')
    try:
        ranges = decode_ranges_png(path.read_bytes(), what)
    except InputError as exc:
        raise ResultsError(f'{path}: {exc}') from None
    if ranges_digest(ranges) != expected:
        raise ResultsError(f'{path}: {what} does not match the sha256 its search recorded')
    return ranges
