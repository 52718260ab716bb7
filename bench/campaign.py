"""Benchmark: a campaign's cells per minute with the local executor (1 and 2 workers) and on local Dask.

Usage: python bench/campaign.py [--images 2] [--runs 3] [--population 6] [--evaluations 60] [--size 96x72]
Builds a tiny random CLIP (no download), writes small frames, and runs the same campaign into a fresh
results directory per executor setting. Worker start-up (imports, model load) counts: it is part of
what a user waits for.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np


def frames(folder: Path, count: int, width: int, height: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:height, 0:width]
    for i in range(count):
        rgb = np.zeros((height, width, 3), np.uint8)
        rgb[..., 0] = xx * 255 // max(width - 1, 1)
        rgb[..., 1] = yy * 255 // max(height - 1, 1)
        rgb[..., 2] = rng.integers(0, 256)
        cv2.imwrite(str(folder / f'frame{i:03d}.png'), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def steady(out: Path) -> float:
    """Cells per minute once the first cell is done: start-up left out."""
    finished = sorted(json.loads(p.read_text())['finished'] for p in out.glob('cells/*/cell.json'))
    if len(finished) < 2 or finished[-1] <= finished[0]:
        return float('nan')
    return 60.0 * (len(finished) - 1) / (finished[-1] - finished[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--images', type=int, default=2)
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--population', type=int, default=6)
    parser.add_argument('--evaluations', type=int, default=60)
    parser.add_argument('--size', default='96x72')
    parser.add_argument('--no-dask', action='store_true')
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split('x'))

    from metavlm_ros.campaign.config import parse_config
    from metavlm_ros.campaign.runner import run_campaign
    from metavlm_ros.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as root:
        root = Path(root)
        model = build_tiny_model('clip', root / 'clip', seed=0)
        frames(root / 'frames', args.images, width, height)
        config = parse_config(
            {
                'frames': ['frames'],
                'models': [{'backend': 'clip', 'model': str(model), 'device': 'cpu'}],
                'runs': args.runs,
                'population': args.population,
                'evaluations': args.evaluations,
            },
            base_dir=root,
        )
        settings = [('local', 1), ('local', 2)] + ([] if args.no_dask else [('dask', 1), ('dask', 2)])
        rows = []
        for executor, workers in settings:
            started = time.perf_counter()
            out = root / f'out-{executor}-{workers}'
            result = run_campaign(config, out, executor=executor, workers=workers, progress=False)
            wall = time.perf_counter() - started
            rows.append(
                (executor, workers, result.completed, wall, 60.0 * result.completed / wall, steady(out))
            )
        print(
            f'campaign: {args.images} images x {args.runs} runs x 2 algorithms, population '
            f'{args.population}, {args.evaluations} evaluations, {width}x{height} frames, tiny CLIP on CPU'
        )
        header = ('executor', 'workers', 'cells', 'seconds', 'cells/min', 'steady cells/min')
        print(f'{header[0]:<10}{header[1]:>8}{header[2]:>7}{header[3]:>10}{header[4]:>11}{header[5]:>18}')
        for executor, workers, cells, wall, rate, steady_rate in rows:
            print(f'{executor:<10}{workers:>8}{cells:>7}{wall:>10.1f}{rate:>11.1f}{steady_rate:>18.1f}')
        print(
            'cells/min counts start-up (worker processes, imports, model load); steady cells/min counts the'
        )
        print('cells finished after the first one, over the time since it finished.')
    return 0


if __name__ == '__main__':
    sys.exit(main())
