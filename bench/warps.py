"""Measure how far fused warps are from sequential ones: grey-level MAE over Rand compositions of demo scenes.

Run from the repository root: ``python bench/warps.py [--scenes 4] [--compositions 500] [--width 640]``.

Each scene is the first frame of the demo scene seeded 0, 1, ...; each composition a sample of the
paper's Rand (docs/method.md §7) seeded like its scene. Prints the share of compositions whose two
follow-up frames are identical and the median, 95th percentile and maximum mean absolute
difference, in grey levels (0-255, over all pixels and channels).
"""

from __future__ import annotations

import argparse

import numpy as np

from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.method.encoding import SearchSpace, decode
from metavlm_ros.method.relations import apply_composition
from metavlm_ros.method.search import rand_genotypes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--scenes', type=int, default=4)
    parser.add_argument('--compositions', type=int, default=500, help='per scene')
    parser.add_argument('--width', type=int, default=640)  # and --height
    parser.add_argument('--height', type=int, default=360)
    args = parser.parse_args()
    maes = []
    for seed in range(args.scenes):
        rgb, _ = SceneGenerator(width=args.width, height=args.height, seed=seed).frame(0)
        for x in rand_genotypes(SearchSpace.default(), args.compositions, np.random.default_rng(seed)):
            composition = decode(x)
            fused = apply_composition(rgb, composition, fuse=True).astype(np.float64)
            sequential = apply_composition(rgb, composition, fuse=False).astype(np.float64)
            maes.append(float(np.abs(fused - sequential).mean()))
    mae = np.asarray(maes)
    print(
        f'{mae.size} compositions on {args.scenes} {args.width}x{args.height} scenes: identical '
        f'{100 * np.mean(mae == 0):.1f}%; MAE median {np.median(mae):.3f}, 95th percentile '
        f'{np.percentile(mae, 95):.2f}, max {mae.max():.2f} grey levels'
    )


if __name__ == '__main__':
    main()
