"""Benchmark: how complete integrated gradients' maps are on the demo CLIP, by the number of steps.

Usage: python bench/attribution_completeness.py [--frames 6] [--steps 8 16 32] [--seed 970000]

Renders --frames fresh 480x270 scenes (one a seed from --seed) and, for the animal and the trash score
of each, makes the integrated-gradients map `metavlm modes --maps` makes (explain/attribution.py
`gradient_map`, from the frame's mean colour) at each step count, and prints the completeness gap (the
attributions' sum minus the score's rise from the baseline) as a share of the rise: the median and the
largest over the maps whose score rose by more than 0.001. docs/explain.md quotes it. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=6)
    parser.add_argument('--steps', type=int, nargs='+', default=[8, 16, 32])
    parser.add_argument('--seed', type=int, default=970_000)
    args = parser.parse_args()

    import torch

    from metavlm_ros.demo.scenes import render_scenes
    from metavlm_ros.explain.attribution import gradient_map
    from metavlm_ros.models.vlm import create_backend

    torch.set_num_threads(2)
    scenes = render_scenes(args.frames, args.seed, frames_per_scene=1, sizes=((480, 270),), keep_frames=True)
    backend = create_backend('clip', 'demo', device='cpu')
    for steps in args.steps:
        started, shares = time.monotonic(), []
        for frame in scenes.frames:
            for cls in ('animal', 'trash'):
                made = gradient_map(backend, frame, cls, steps)
                rise = abs(made.score - made.detail['baseline_score'])
                if rise > 1e-3:
                    shares.append(abs(made.detail['completeness_gap']) / rise)
        print(
            f'{steps:3d} steps: completeness gap {100 * np.median(shares):.3f} % of the rise (median), '
            f'{100 * np.max(shares):.3f} % at most, over {len(shares)} maps; '
            f'{(time.monotonic() - started) / (2 * len(scenes.frames)):.2f} s a map'
        )


if __name__ == '__main__':
    main()
