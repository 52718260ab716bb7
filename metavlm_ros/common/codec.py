"""The one image codec: sensor_msgs/Image and CompressedImage fields to RGB uint8 frames and back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from metavlm_ros.common.errors import InputError

__all__ = [
    'COMPRESSED_FORMATS',
    'JPEG_FORMAT',
    'JPEG_QUALITY',
    'PNG_FORMAT',
    'RAW_ENCODINGS',
    'RawImage',
    'decode_compressed',
    'decode_raw',
    'encode_compressed',
    'encode_png',
    'encode_raw',
    'reduce_to_8bit',
    'to_rgb8',
]

# Every sensor_msgs/Image encoding a camera frame may come in: encoding -> (channels, bytes per
# channel, channel order of a colour image or None for grey). The names are ROS's, case and all.
RAW_ENCODINGS: dict[str, tuple[int, int, str | None]] = {
    'rgb8': (3, 1, 'rgb'),
    'bgr8': (3, 1, 'bgr'),
    'rgba8': (4, 1, 'rgb'),
    'bgra8': (4, 1, 'bgr'),
    'mono8': (1, 1, None),
    'mono16': (1, 2, None),
    'rgb16': (3, 2, 'rgb'),
    'bgr16': (3, 2, 'bgr'),
    'rgba16': (4, 2, 'rgb'),
    'bgra16': (4, 2, 'bgr'),
}
# A CompressedImage format must name one of these (image_transport writes e.g. 'rgb8; jpeg
# compressed bgr8'); an empty format is tried as whatever the bytes are.
COMPRESSED_FORMATS = ('jpeg', 'jpg', 'png')
# What every JPEG CompressedImage of this package is written with: bags, the launcher's camera.
JPEG_QUALITY = 90
# The format strings image_transport's compressed plugin writes for an rgb8 frame (and expects).
JPEG_FORMAT = 'rgb8; jpeg compressed bgr8'
PNG_FORMAT = 'rgb8; png compressed bgr8'


@dataclass(frozen=True)
class RawImage:
    """The fields of a sensor_msgs/Image, as every message type (rclpy, rosbags) spells them."""

    encoding: str
    width: int
    height: int
    step: int
    is_bigendian: int
    data: bytes


# The 8-bit level of every 16-bit value, by the rule of reduce_to_8bit: a table look-up is twice as
# fast as the division on a camera frame.
_LEVELS = ((np.arange(65536, dtype=np.uint32) + 128) // 257).astype(np.uint8)


def reduce_to_8bit(array: np.ndarray) -> np.ndarray:
    """The one 16-bit to 8-bit rule: each value to the nearest 8-bit level, `(x + 128) // 257`.

    65535 / 255 == 257 exactly, so the 8-bit level v stands for the 16-bit value 257 * v and the
    nearest level to x is round(x / 257); as 257 is odd, x / 257 is never halfway and
    `(x + 128) // 257` is that rounding in integers. It maps 0 -> 0 and 65535 -> 255 and is off by at
    most half a level. Keeping the high byte (`x >> 8`) would truncate instead: it is biased half
    a level dark and maps 383, nearer level 1, to 0.

    Args:
        array: A uint16 array of any shape and byte order.

    Returns:
        The uint8 array of the same shape.
    """
    return np.take(_LEVELS, array)


# (BGR order, channels) -> OpenCV conversion to RGB; None: the image is RGB already.
_TO_RGB = {
    (True, 3): cv2.COLOR_BGR2RGB,
    (True, 4): cv2.COLOR_BGRA2RGB,
    (False, 3): None,
    (False, 4): cv2.COLOR_RGBA2RGB,
}


def to_rgb8(image: np.ndarray, order: str = 'bgr') -> np.ndarray:
    """Convert a decoded image of any common layout to RGB uint8, C-contiguous.

    Grayscale becomes three equal channels. A 4-channel image loses its alpha channel (the colour
    channels are kept as they are, not composited: a robot camera frame has no meaningful
    transparency). 16-bit images are reduced by `reduce_to_8bit` (the nearest 8-bit level); float
    images in [0, 1] are scaled by 255.

    Args:
        image: A 2-D (H, W) or 3-D (H, W, C) array, C in {1, 3, 4}.
        order: Channel order of a 3- or 4-channel input, 'bgr' (OpenCV) or 'rgb'.

    Returns:
        The RGB uint8 frame.

    Raises:
        InputError: The array has an unsupported shape or dtype.
    """
    if image.dtype.kind == 'u' and image.dtype.itemsize == 2:  # uint16 of either byte order
        image = reduce_to_8bit(image)
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
        # OpenCV swaps and drops channels many times faster than a reversed numpy view is copied.
        code = _TO_RGB.get((order == 'bgr', image.shape[2]))
        rgb = image if code is None else cv2.cvtColor(np.ascontiguousarray(image), code)
    else:
        raise InputError(f'unsupported image shape {tuple(image.shape)}')
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise InputError('empty image')
    return np.ascontiguousarray(rgb)


def _owned(rgb: np.ndarray) -> np.ndarray:
    # A frame outlives its message: never hand out a view of the message's buffer.
    return rgb if rgb.flags.owndata else rgb.copy()


def decode_raw(
    encoding: str, width: int, height: int, step: int, is_bigendian: bool | int, data: Any
) -> np.ndarray:
    """Decode the fields of a sensor_msgs/Image to an RGB uint8 frame.

    Rows padded beyond the pixels (`step` larger than a row) are read without the padding.

    Args:
        encoding: One of RAW_ENCODINGS.
        width: Pixels per row.
        height: Rows.
        step: Bytes per row, padding included.
        is_bigendian: Byte order of 16-bit values (true: big endian).
        data: The pixel bytes (bytes, numpy uint8, array.array: anything with the buffer protocol).

    Returns:
        The frame (H, W, 3), RGB uint8, C-contiguous and owning its memory.

    Raises:
        InputError: Unknown encoding, empty image, or a step or data size that does not fit.
    """
    encoding = str(encoding)
    if encoding not in RAW_ENCODINGS:
        known = ', '.join(RAW_ENCODINGS)
        raise InputError(f'unsupported image encoding {encoding!r} (supported: {known})')
    channels, depth, order = RAW_ENCODINGS[encoding]
    width, height, step = int(width), int(height), int(step)
    if width <= 0 or height <= 0:
        raise InputError(f'empty image ({width}x{height})')
    row_bytes = width * channels * depth
    if step < row_bytes:
        raise InputError(
            f'image step {step} is smaller than a {width}-pixel {encoding} row ({row_bytes} bytes)'
        )
    buffer = np.frombuffer(data, np.uint8)
    if step * height != buffer.size:
        raise InputError(f'image data has {buffer.size} bytes but step*height is {step * height}')
    rows = np.ascontiguousarray(buffer.reshape(height, step)[:, :row_bytes])
    dtype = np.dtype(np.uint8) if depth == 1 else np.dtype('>u2' if is_bigendian else '<u2')
    pixels = rows.view(dtype).reshape((height, width, channels))
    return _owned(to_rgb8(pixels, order=order or 'rgb'))


def decode_compressed(fmt: str, data: Any) -> np.ndarray:
    """Decode the fields of a sensor_msgs/CompressedImage (JPEG or PNG) to an RGB uint8 frame.

    A 16-bit PNG is reduced by the same rule as a 16-bit Image (`reduce_to_8bit`), not by OpenCV's.

    Args:
        fmt: The message's format: empty, or naming jpeg, jpg or png (image_transport's
            'rgb8; jpeg compressed bgr8' and plain 'jpeg' alike).
        data: The compressed bytes.

    Returns:
        The frame (H, W, 3), RGB uint8, C-contiguous and owning its memory.

    Raises:
        InputError: A depth image, another format, empty or corrupt data.
    """
    fmt = str(fmt)
    lower = fmt.lower()
    if 'compresseddepth' in lower:
        raise InputError(f'compressed depth images are not camera frames (format {fmt!r})')
    if lower and not any(name in lower for name in COMPRESSED_FORMATS):
        raise InputError(f'unsupported compressed image format {fmt!r} (expected jpeg or png)')
    buffer = np.frombuffer(data, np.uint8)
    if buffer.size == 0:
        raise InputError(f'empty compressed image (format {fmt!r})')
    try:
        # ANYDEPTH keeps 16 bits for our own reduction; ANYCOLOR keeps grey grey and drops alpha.
        image = cv2.imdecode(buffer, cv2.IMREAD_ANYCOLOR | cv2.IMREAD_ANYDEPTH)
    except cv2.error:
        image = None
    if image is None or image.size == 0:
        raise InputError(f'corrupt or undecodable compressed image (format {fmt!r})')
    return _owned(to_rgb8(image, order='bgr'))


def _check_rgb(rgb: Any) -> np.ndarray:
    array = np.asarray(rgb)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or array.size == 0:
        raise InputError(f'expected an RGB uint8 frame of shape (H, W, 3), got {array.dtype} {array.shape}')
    return np.ascontiguousarray(array)


def encode_raw(rgb: np.ndarray) -> RawImage:
    """The fields of an rgb8 sensor_msgs/Image holding an RGB frame (rows unpadded).

    Raises:
        InputError: Not a non-empty (H, W, 3) uint8 frame.
    """
    array = _check_rgb(rgb)
    height, width = array.shape[:2]
    return RawImage('rgb8', width, height, width * 3, 0, array.tobytes())


def encode_png(rgb: np.ndarray) -> bytes:
    """The one PNG encoder: an RGB uint8 frame as PNG bytes (callers write them as their files need).

    Raises:
        InputError: OpenCV could not encode the frame.
    """
    ok, data = cv2.imencode('.png', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise InputError(f'a {rgb.shape[1]}x{rgb.shape[0]} frame could not be encoded as PNG')
    return data.tobytes()


def encode_compressed(rgb: np.ndarray, kind: str = 'jpeg', quality: int = JPEG_QUALITY) -> tuple[str, bytes]:
    """The format and data of a sensor_msgs/CompressedImage holding an RGB frame.

    Args:
        rgb: The (H, W, 3) RGB uint8 frame.
        kind: 'jpeg' or 'png'.
        quality: JPEG quality, 0-100 (ignored for PNG).

    Returns:
        (format, data): JPEG_FORMAT or PNG_FORMAT, and the compressed bytes.

    Raises:
        InputError: Not an RGB frame, or an unknown kind, or OpenCV could not encode it.
    """
    array = _check_rgb(rgb)
    if kind == 'png':
        return PNG_FORMAT, encode_png(array)
    if kind != 'jpeg':
        raise InputError(f"unknown compressed image kind {kind!r} (expected 'jpeg' or 'png')")
    bgr = cv2.cvtColor(array, cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode('.jpg', bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise InputError(f'a {array.shape[1]}x{array.shape[0]} frame could not be encoded as JPEG')
    return JPEG_FORMAT, data.tobytes()
