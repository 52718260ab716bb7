"""Benchmark: ms per frame of the six-relation composition: fused OpenCV, OpenCV one by one, PIL one by one.

Run from the repository root: ``python bench/transforms.py [--repeats 15] [--threads 1]``.

All pipelines start from and end with an RGB uint8 numpy frame, as metavlm_ros frames are, and run
with the same number of threads (OpenCV is limited to --threads; PIL uses one). PIL has no CLAHE,
so the PIL pipeline equalises with the same cv2 CLAHE call. Two figures are reported apart:
fusion (OpenCV one by one -> OpenCV fused: one warp instead of several) and the library (PIL one
by one -> OpenCV one by one). Sizes: 1920x1080 and the default working size of a 224-pixel model
(448x252); per-relation costs are listed at both. Repetitions interleave the pipelines; min /
median / max are printed. The bench exits 1 when fused and one-by-one OpenCV, or OpenCV and PIL,
differ by more than 2 and 4 grey levels on average over the central 75% of a smoothed frame (they
differ only by interpolation and rounding there; a wrong convention costs tens of grey levels).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from metavlm_ros.method.encoding import Composition
from metavlm_ros.method.relations import CLAHE_TILES, apply_composition, apply_relation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved, per_size_main, spread  # noqa: E402

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


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
    h, w = a.shape[:2]
    inner = (slice(h // 8, h - h // 8), slice(w // 8, w - w // 8))
    return float(np.abs(a[inner].astype(int) - b[inner].astype(int)).mean())


def bench_size(width: int, height: int, repeats: int, checks: Checks) -> None:
    frame = synthetic_frame(width, height)
    composition = Composition.from_parameters(PARAMETERS)
    pipelines = {
        'OpenCV fused (metavlm_ros)': lambda: apply_composition(frame, composition, fuse=True),
        'OpenCV one by one': lambda: apply_composition(frame, composition, fuse=False),
        'PIL one by one (+ cv2 CLAHE)': lambda: pil_composition(frame, PARAMETERS),
    }
    for function in pipelines.values():
        function()  # warm-up: first calls allocate buffers and thread pools
    samples = interleaved(pipelines, repeats)
    print(f'frame {width}x{height}: ms per frame, min / median / max of {repeats} interleaved repetitions')
    for name, values in samples.items():
        print(f'  {name:34s} {fmt(values, 1000.0):>24}')
    med = {name: spread(values)[1] for name, values in samples.items()}
    fused, single, pil = (
        med['OpenCV fused (metavlm_ros)'],
        med['OpenCV one by one'],
        med['PIL one by one (+ cv2 CLAHE)'],
    )
    print(
        f'  median ratios: fusion (OpenCV one by one / fused) {single / fused:.2f}x; library '
        f'(PIL / OpenCV, both one by one) {pil / single:.2f}x; together {pil / fused:.2f}x'
    )

    # Each relation alone, and CLAHE's colour conversions apart from the equalisation itself.
    lab = cv2.cvtColor(frame, cv2.COLOR_RGB2LAB)
    light = np.ascontiguousarray(lab[..., 0])
    clahe = cv2.createCLAHE(clipLimit=1.5, tileGridSize=CLAHE_TILES)
    steps = {
        f'{rid} alone': (lambda r=rid, v=v: apply_relation(frame, r, v)) for rid, v in PARAMETERS.items()
    }
    steps['  CLAHE: RGB -> LAB'] = lambda: cv2.cvtColor(frame, cv2.COLOR_RGB2LAB)
    steps['  CLAHE: equalise L'] = lambda: clahe.apply(light)
    steps['  CLAHE: LAB -> RGB'] = lambda: cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)
    for function in steps.values():
        function()
    for name, values in interleaved(steps, repeats).items():
        print(f'  {name:34s} {fmt(values, 1000.0, 2):>24}')

    smooth = cv2.GaussianBlur(frame, (0, 0), 3.0)
    fused = apply_composition(smooth, composition, fuse=True)
    one_by_one = apply_composition(smooth, composition, fuse=False)
    pil = pil_composition(smooth, PARAMETERS)
    # One interpolation instead of several, and two libraries' rounding: close, never equal. A wrong
    # convention (shear sign, rotation direction) costs 20 to 35 grey levels here.
    gap = _agreement(fused, one_by_one)
    checks.check(
        gap <= 2.0, f'{width}x{height}: mean |fused - one by one| {gap:.2f} grey levels (tolerance 2)'
    )
    gap = _agreement(one_by_one, pil)
    checks.check(gap <= 4.0, f'{width}x{height}: mean |OpenCV - PIL| {gap:.2f} grey levels (tolerance 4)')


def main(argv: list[str] | None = None) -> int:
    """Print ms per frame of each pipeline, fusion and library ratios, per-relation costs and checks."""
    return per_size_main(
        __doc__.splitlines()[0],
        bench_size,
        argv,
        banner=f'composition {Composition.from_parameters(PARAMETERS)}',
        threads_help='OpenCV threads (default 1, as PIL)',
    )


if __name__ == '__main__':
    raise SystemExit(main())
