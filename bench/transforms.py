"""Benchmark: ms per 1920x1080 frame of the six-relation composition, fused OpenCV vs PIL one by one.

Run from the repository root: ``python bench/transforms.py [--repeats 15] [--width 1920 --height 1080]``.

Both pipelines start from and end with an RGB uint8 numpy frame, as metavlm_ros frames are. PIL has
no CLAHE, so both pipelines equalise with the same cv2 CLAHE call (on the L channel of LAB, 16x16
tiles); the difference comes from the five other relations and from fusing the affine warps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np
from PIL import Image

from metavlm_ros.core.encoding import Composition
from metavlm_ros.core.relations import CLAHE_TILES, apply_composition

# Every relation active, none at its nominal value.
PARAMETERS = {
    'rotation': 3.0,
    'scaling': 1.1,
    'histogram_equalization': 1.5,
    'downsampling': 0.95,
    'shear': 0.1,
    'translation': 0.02,
}


def synthetic_frame(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A structured RGB frame: gradients, textured noise and bright blocks, like a lit seabed."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), np.uint8)
    frame[..., 0] = (40 + 60 * xx / width).astype(np.uint8)
    frame[..., 1] = (80 + 90 * yy / height).astype(np.uint8)
    frame[..., 2] = 140
    frame = cv2.add(frame, rng.integers(0, 40, frame.shape, dtype=np.uint8))
    for _ in range(40):
        x0, y0 = int(rng.integers(0, width - 80)), int(rng.integers(0, height - 80))
        frame[y0 : y0 + int(rng.integers(10, 80)), x0 : x0 + int(rng.integers(10, 80))] = rng.integers(
            0, 256, 3
        )
    return frame


def _clahe(rgb: np.ndarray, clip_limit: float) -> np.ndarray:
    """The same CLAHE as metavlm_ros's MR3; PIL has none."""
    lab = cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB)
    lab[..., 0] = cv2.createCLAHE(clipLimit=clip_limit, tileGridSize=CLAHE_TILES).apply(
        np.ascontiguousarray(lab[..., 0])
    )
    return cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)


def pil_composition(frame: np.ndarray, p: dict[str, float]) -> np.ndarray:
    """The active relations of `p` one at a time with PIL (CLAHE through cv2), numpy in and out."""
    height, width = frame.shape[:2]
    black = (0, 0, 0)
    image = Image.fromarray(frame)
    if 'rotation' in p:
        # MR1: PIL rotates counter-clockwise about the image centre, same size.
        image = image.rotate(p['rotation'], resample=Image.Resampling.BILINEAR, fillcolor=black)
    if 'scaling' in p:
        # MR2: resize by z, then centre-crop (z > 1) or centre-pad black (z < 1).
        zoom = p['scaling']
        zw, zh = round(width * zoom), round(height * zoom)
        image = image.resize((zw, zh), Image.Resampling.BILINEAR)
        if zoom >= 1:
            left, top = (zw - width) // 2, (zh - height) // 2
            image = image.crop((left, top, left + width, top + height))
        else:
            canvas = Image.new('RGB', (width, height), black)
            canvas.paste(image, ((width - zw) // 2, (height - zh) // 2))
            image = canvas
    if 'histogram_equalization' in p:
        # MR3: CLAHE, through numpy.
        image = Image.fromarray(_clahe(np.asarray(image), p['histogram_equalization']))
    if 'downsampling' in p:
        # MR4: nearest down and back up.
        scale = p['downsampling']
        image = image.resize((int(width * scale), int(height * scale)), Image.Resampling.NEAREST)
        image = image.resize((width, height), Image.Resampling.NEAREST)
    if 'shear' in p:
        # MR5: x' = x + k*y; PIL's affine data maps output to input, hence -k.
        image = image.transform(
            (width, height),
            Image.Transform.AFFINE,
            (1.0, -p['shear'], 0.0, 0.0, 1.0, 0.0),
            resample=Image.Resampling.BILINEAR,
            fillcolor=black,
        )
    if 'translation' in p:
        # MR6: shift by int(W*p) pixels onto a black canvas.
        canvas = Image.new('RGB', (width, height), black)
        canvas.paste(image, (int(width * p['translation']), 0))
        image = canvas
    return np.asarray(image)


def _median_ms(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Print the median ms per frame of each pipeline and the speed-up of the fused one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--width', type=int, default=1920)
    parser.add_argument('--height', type=int, default=1080)
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--threads', type=int, default=None, help='OpenCV threads (default: OpenCV decides)')
    args = parser.parse_args(argv)
    if args.threads is not None:
        cv2.setNumThreads(args.threads)

    frame = synthetic_frame(args.width, args.height)
    composition = Composition.from_parameters(PARAMETERS)
    pipelines = {
        'metavlm_ros fused (OpenCV)': lambda: apply_composition(frame, composition, fuse=True),
        'metavlm_ros one by one (OpenCV)': lambda: apply_composition(frame, composition, fuse=False),
        'PIL one by one (+ cv2 CLAHE)': lambda: pil_composition(frame, PARAMETERS),
    }
    for function in pipelines.values():
        function()  # warm-up: first calls allocate buffers and thread pools
    # Interleave the pipelines so that load from other processes hits them alike.
    samples: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.repeats):
        for name, function in pipelines.items():
            samples[name].append(_median_ms(function, 1))
    medians = {name: statistics.median(values) for name, values in samples.items()}

    # Both pipelines do the same geometry; on a smooth frame they differ only by interpolation
    # rounding and the nearest-neighbour sampling convention (PIL samples pixel centres).
    smooth = cv2.GaussianBlur(frame, (0, 0), 3.0)
    ours, pil = apply_composition(smooth, composition), pil_composition(smooth, PARAMETERS)
    h, w = args.height, args.width
    inner = (slice(h // 8, h - h // 8), slice(w // 8, w - w // 8))
    agreement = np.abs(ours[inner].astype(int) - pil[inner].astype(int)).mean()

    print(f'composition {composition}')
    print(
        f'frame {w}x{h}, median of {args.repeats} interleaved repeats, OpenCV threads {cv2.getNumThreads()}'
    )
    for name, value in medians.items():
        print(f'  {name:34s} {value:8.1f} ms/frame')
    fused, baseline = medians['metavlm_ros fused (OpenCV)'], medians['PIL one by one (+ cv2 CLAHE)']
    print(f'  speed-up fused vs PIL: {baseline / fused:.2f}x')
    print(f'  mean |fused - PIL| on a smoothed frame, central 75%: {agreement:.2f} grey levels')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
