"""Benchmark: scene generation frames/s at 1080p on one core; bag read frames/s and peak RSS by bag length.

Usage: python bench/footage.py [--frames 20] [--sizes 100 500] [--compressed] [--keep DIR]

Generation: each environment renders --frames frames (after one warm-up frame) with OpenCV limited to
one thread and the process pinned to one CPU; the target is 5 frames/s. Rates per CPU second (what
one dedicated core delivers) and per wall second (lower when the machine is shared) are shown.
Bag reading: a bag of each length is written (frames cycle through 10 rendered scene frames, so
writing stays quick; reading cost does not depend on the pixels), then read with
metavlm_ros.footage.frames.iter_frames in a fresh subprocess per bag, which reports its frames/s and
its peak resident memory (VmHWM from /proc/self/status). Flat memory across lengths shows streaming.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READER = """
import json, sys, time
import cv2
cv2.setNumThreads(1)
from metavlm_ros.footage.frames import iter_frames
start = time.perf_counter()
n = 0
checksum = 0
for frame in iter_frames([sys.argv[1]]):
    n += 1
    checksum += int(frame.rgb[0, 0, 0])
seconds = time.perf_counter() - start
hwm = 0
with open('/proc/self/status') as status:
    for line in status:
        if line.startswith('VmHWM:'):
            hwm = int(line.split()[1]) * 1024
print(json.dumps({'frames': n, 'seconds': seconds, 'peak_rss': hwm}))
"""


def pin_one_core() -> str:
    if hasattr(os, 'sched_setaffinity'):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f'pinned to CPU {cpu}'
    return 'not pinned (no sched_setaffinity)'


def bench_generation(frames: int) -> dict[str, tuple[float, float]]:
    import cv2

    from metavlm_ros.footage.scenes import ENVIRONMENTS, SceneGenerator

    cv2.setNumThreads(1)
    rates = {}
    for env in ENVIRONMENTS:
        gen = SceneGenerator(1920, 1080, 10, seed=1, environment=env)
        gen.frame(0)
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(1, frames + 1):
            gen.frame(i * 3)
        rates[env] = (frames / (time.process_time() - cpu), frames / (time.perf_counter() - start))
    return rates


def bench_bags(root: Path, sizes: list[int], compressed: bool) -> list[dict]:
    from metavlm_ros.footage.bags import write_bag
    from metavlm_ros.footage.scenes import SceneGenerator

    gen = SceneGenerator(1920, 1080, 10, seed=2, environment='shallow')
    pool = [gen.frame(i * 10) for i in range(10)]
    results = []
    for size in sizes:
        bag = root / f'bag{size}'
        start = time.perf_counter()
        write_bag(
            bag, (pool[i % len(pool)] for i in range(size)), fps=10, compressed=compressed, overwrite=True
        )
        write_s = time.perf_counter() - start
        disk = sum(p.stat().st_size for p in bag.iterdir())
        env = dict(os.environ, OPENCV_NUM_THREADS='1')
        out = subprocess.run(
            [sys.executable, '-c', READER, str(bag)], capture_output=True, text=True, check=True, env=env
        )
        read = json.loads(out.stdout)
        read.update(size=size, write_s=write_s, disk=disk)
        results.append(read)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=20, help='frames per environment for generation')
    parser.add_argument('--sizes', type=int, nargs='+', default=[100, 500], help='bag lengths in frames')
    parser.add_argument('--compressed', action='store_true', help='JPEG bags instead of raw rgb8')
    parser.add_argument('--keep', default=None, help='write the bags here instead of a temporary folder')
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    print(f'generation at 1920x1080, one thread, {pin_one_core()}')
    rates = bench_generation(args.frames)
    # CPU time is what one dedicated core delivers; wall time also counts whatever else the machine runs.
    print(f'  {"":8s} {"per CPU s":>10s} {"per wall s":>11s}')
    for env, (cpu_rate, wall_rate) in rates.items():
        verdict = 'meets' if cpu_rate >= 5 else 'BELOW'
        print(f'  {env:8s} {cpu_rate:10.1f} {wall_rate:11.1f}  ({verdict} the target of 5 frames/s)')
    print(f'  slowest  {min(r[0] for r in rates.values()):10.1f}')
    print(f'  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs')

    kind = 'JPEG CompressedImage' if args.compressed else 'raw rgb8 Image'
    print(f'bag reading (mcap, {kind}, 1920x1080), fresh process per bag')
    with tempfile.TemporaryDirectory(prefix='metavlm-footage-') as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = bench_bags(root, args.sizes, args.compressed)
    print(f'  {"frames":>6s} {"on disk":>10s} {"write s":>8s} {"read frames/s":>14s} {"peak RSS":>10s}')
    for r in results:
        print(
            f'  {r["size"]:6d} {r["disk"] / 1e6:8.0f}MB {r["write_s"]:8.1f} '
            f'{r["frames"] / r["seconds"]:14.1f} {r["peak_rss"] / 1e6:8.0f}MB'
        )
    return 0


if __name__ == '__main__':
    sys.exit(main())
