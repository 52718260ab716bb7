"""Benchmark: ms per frame of each relation alone, the five underwater relations next to the paper's six.

Run from the repository root: ``python bench/relations.py [--repeats 15] [--threads 1]``.

Every relation is applied alone to the same synthetic frame (bench/transforms.py's), at a value
inside its range and away from its nominal value (the paper's six at the values bench/transforms.py
uses, the underwater relations at the middle of their ranges; motion blur also at other lengths
and angles, whose kernels differ). Sizes: 1920x1080 and the default working size of a 224-pixel
model (448x252). Repetitions interleave all of them, rotated so none always runs first; min /
median / max are printed. OpenCV runs with --threads threads.

Caches: marine snow keeps its particle table and low light its noise field per frame size (both
depend only on the size); the warm-up call builds them, and their one-off cost is printed apart.

The bench exits 1 unless every relation changes the frame at the benched value and returns it
byte for byte at its nominal value.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from metavlm_ros.method import underwater
from metavlm_ros.method.relations import RELATION_BY_ID, apply_relation
from metavlm_ros.method.underwater import UNDERWATER_PARAMETERS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved, per_size_main, spread  # noqa: E402
from transforms import PARAMETERS, synthetic_frame  # noqa: E402

UNDERWATER = {
    'turbidity': underwater.turbidity,
    'colour_cast': underwater.colour_cast,
    'motion_blur': underwater.motion_blur,
    'marine_snow': underwater.marine_snow,
    'low_light': underwater.low_light,
}


def _middle(relation: str) -> float:
    _, _, _, low, high, _ = UNDERWATER_PARAMETERS[relation]
    return (low + high) / 2.0


MIDDLE = {relation: _middle(relation) for relation in UNDERWATER}
# The blur's searched angle changes its kernel's shape (a row or a column at 0 and 90 degrees, a
# square at 45): (length, angle) pairs timed beside the horizontal blur of the middle length.
BLUR_VARIANTS = ((0.005, 45.0), (0.005, 90.0), (0.01, 0.0), (0.01, 45.0))


def bench_size(width: int, height: int, repeats: int, checks: Checks) -> None:
    frame = synthetic_frame(width, height)
    paper = {
        f'MR{RELATION_BY_ID[relation].number} {relation} {value:g}': (
            lambda r=relation, v=value: apply_relation(frame, r, v)
        )
        for relation, value in PARAMETERS.items()
    }
    added = {
        f'{relation} {_middle(relation):g}': (lambda f=function, v=MIDDLE[relation]: f(frame, v))
        for relation, function in UNDERWATER.items()
    }
    added.update(
        {
            f'motion_blur {length:g} at {angle:g} deg': (
                lambda n=length, a=angle: underwater.motion_blur(frame, n, a)
            )
            for length, angle in BLUR_VARIANTS
        }
    )

    underwater._snow_particles.cache_clear()
    underwater._sensor_noise.cache_clear()
    print(f'frame {width}x{height}: ms per frame, min / median / max of {repeats} interleaved repetitions')
    for relation in ('marine_snow', 'low_light'):
        start = time.perf_counter()
        UNDERWATER[relation](frame, _middle(relation))
        elapsed = (time.perf_counter() - start) * 1e3
        print(f'  first {relation} call at this size (builds its cache): {elapsed:.1f} ms')
    variants = {**paper, **added}
    for function in variants.values():
        function()  # warm-up: first calls allocate buffers and thread pools
    samples = interleaved(variants, repeats)
    print("  the paper's six")
    for name in paper:
        print(f'    {name:34s} {fmt(samples[name], 1000.0, 2):>24}')
    print('  underwater (opt-in)')
    for name in added:
        print(f'    {name:34s} {fmt(samples[name], 1000.0, 2):>24}')
    medians = {name: spread(values)[1] * 1e3 for name, values in samples.items()}
    dearest_paper = max(medians[name] for name in paper)
    dearest_added = max(added, key=medians.get)
    print(
        f"  dearest median: the paper's six {dearest_paper:.2f} ms; underwater {dearest_added} "
        f'{medians[dearest_added]:.2f} ms ({medians[dearest_added] / dearest_paper:.2f}x)'
    )

    for relation, function in UNDERWATER.items():
        nominal = UNDERWATER_PARAMETERS[relation][2]
        identity = np.array_equal(function(frame, nominal), frame)
        checks.check(identity, f'{width}x{height}: {relation} at nominal is the identity')
        checks.check(
            not np.array_equal(function(frame, _middle(relation)), frame),
            f'{width}x{height}: {relation} {_middle(relation):g} changes the frame',
        )


def main(argv: list[str] | None = None) -> int:
    """Print ms per frame of each relation alone at each size, and the checks."""
    return per_size_main(__doc__.splitlines()[0], bench_size, argv)


if __name__ == '__main__':
    raise SystemExit(main())
