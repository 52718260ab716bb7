"""Attribution maps drawn and stored: heat overlays, their difference, a montage (PNG), the numbers (npz)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from metavlm_ros.common.directories import write_file_atomic
from metavlm_ros.common.images import encode_png
from metavlm_ros.explain.attribution import ExampleMaps

__all__ = [
    'MAPS_DIR',
    'MONTAGE_SIDE',
    'STORED_SIDE',
    'coarse',
    'difference_overlay',
    'heat_overlay',
    'map_files',
    'map_numbers',
    'montage',
    'write_maps',
]

#: The folder of the catalogue's directory that holds the maps.
MAPS_DIR = 'maps'
#: The longest side of the grid the numbers behind a map are stored at: fine enough to redraw it,
#: small enough (64 x 48 floats a map) that a catalogue of full-HD frames stays a few hundred kB.
STORED_SIDE = 64
#: The longest side of each tile of a montage, in pixels (six tiles a montage, for a page).
MONTAGE_SIDE = 320
_GUTTER = 4
# Pixel attributions are noisy (integrated gradients) or blocky (occlusion): the overlays show them
# blurred by this share of the frame's longer side, the numbers unblurred.
_BLUR_SHARE = 1 / 50
_DIM = 0.6
_MORE = np.array((230, 40, 30), np.float64)  # red: the follow-up's model looks here more
_LESS = np.array((30, 90, 240), np.float64)  # blue: less


def map_files(rank: int) -> dict[str, str]:
    """The files of one mode's maps, relative to the catalogue's directory, by what they hold."""
    return {
        'source': f'{MAPS_DIR}/{rank}-source.png',
        'followup': f'{MAPS_DIR}/{rank}-followup.png',
        'difference': f'{MAPS_DIR}/{rank}-difference.png',
        'montage': f'{MAPS_DIR}/{rank}-montage.png',
        'numbers': f'{MAPS_DIR}/{rank}.npz',
    }


def _smoothed(values: np.ndarray) -> np.ndarray:
    import cv2

    sigma = max(1.0, max(values.shape) * _BLUR_SHARE)
    return cv2.GaussianBlur(values.astype(np.float32), (0, 0), sigma).astype(np.float64)


def _blend(frame: np.ndarray, colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    alpha = alpha[..., None]
    return (frame.astype(np.float64) * (1 - alpha) + colour * alpha).round().clip(0, 255).astype(np.uint8)


def heat_overlay(frame: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The frame with its map laid over it in the inferno colours: bright where the mass is.

    The map is scaled to its own peak (after the blur), so every map uses the whole colour range; the
    numbers, not the colours, compare two maps.
    """
    import cv2

    heat = _smoothed(mass)
    peak = heat.max()
    level = heat / peak if peak > 0 else heat
    colours = cv2.applyColorMap((level * 255).round().astype(np.uint8), cv2.COLORMAP_INFERNO)
    # Dimmed, a bright frame still shows the heat's bright colours; the frame stays recognisable.
    return _blend(frame * _DIM, colours[..., ::-1].astype(np.float64), 0.75 * level)


def difference_overlay(frame: np.ndarray, difference: np.ndarray) -> np.ndarray:
    """The follow-up frame, greyed, with red where its model looks more than on the source, blue less."""
    change = _smoothed(difference)
    peak = np.abs(change).max()
    level = change / peak if peak > 0 else change
    grey = np.repeat(frame.mean(axis=2, keepdims=True), 3, axis=2)
    colour = np.where(level[..., None] >= 0, _MORE, _LESS)
    return _blend(grey, colour, 0.8 * np.abs(level))


def _tile(image: np.ndarray) -> np.ndarray:
    import cv2

    height, width = image.shape[:2]
    scale = MONTAGE_SIDE / max(height, width)
    if scale >= 1:
        return image
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def montage(maps: ExampleMaps) -> np.ndarray:
    """One picture of a mode's example, two rows of three tiles on white.

    Top: the source, the follow-up, and how far each pixel moved between them (|follow-up - source|).
    Bottom: the source's map, the follow-up's, and their difference (`difference_overlay`).
    """
    source, followup = maps.source_frame, maps.followup_frame
    pixels = np.abs(followup.astype(np.int16) - source.astype(np.int16)).astype(np.uint8)
    rows = [
        [source, followup, pixels],
        [
            heat_overlay(source, maps.source.mass),
            heat_overlay(followup, maps.followup.mass),
            difference_overlay(followup, maps.difference),
        ],
    ]
    tiles = [[_tile(image) for image in row] for row in rows]
    height, width = tiles[0][0].shape[:2]
    out = np.full((2 * height + _GUTTER, 3 * width + 2 * _GUTTER, 3), 255, np.uint8)
    for r, row in enumerate(tiles):
        for c, tile in enumerate(row):
            top, left = r * (height + _GUTTER), c * (width + _GUTTER)
            out[top : top + height, left : left + width] = tile
    return out


def coarse(values: np.ndarray, side: int = STORED_SIDE) -> np.ndarray:
    """`values` summed into blocks so the longer side is at most `side`: each block holds its pixels' sum."""
    import cv2

    height, width = values.shape
    scale = side / max(height, width)
    if scale >= 1:
        return values.astype(np.float32)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    # INTER_AREA averages each block; times the block's area, the sums (and the total) are kept.
    means = cv2.resize(values.astype(np.float64), size, interpolation=cv2.INTER_AREA)
    return (means * (height * width) / (size[0] * size[1])).astype(np.float32)


def map_numbers(maps: ExampleMaps) -> bytes:
    """The numbers behind a mode's maps as an npz: `source`, `followup` and `difference`, each `coarse`.

    `source` and `followup` each sum to 1 (or are all zero); `difference` is follow-up minus source.
    """
    source, followup = coarse(maps.source.mass), coarse(maps.followup.mass)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, source=source, followup=followup, difference=followup - source)
    return buffer.getvalue()


def write_maps(directory: str | Path, rank: int, maps: ExampleMaps) -> list[str]:
    """Write one mode's overlays, montage and numbers under `directory` (`map_files`); their paths."""
    directory = Path(directory)
    (directory / MAPS_DIR).mkdir(exist_ok=True)
    files = map_files(rank)
    contents = {
        'source': encode_png(heat_overlay(maps.source_frame, maps.source.mass)),
        'followup': encode_png(heat_overlay(maps.followup_frame, maps.followup.mass)),
        'difference': encode_png(difference_overlay(maps.followup_frame, maps.difference)),
        'montage': encode_png(montage(maps)),
        'numbers': map_numbers(maps),
    }
    for key, data in contents.items():
        write_file_atomic(directory / files[key], data)
    return [files[key] for key in contents]
