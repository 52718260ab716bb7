"""Benchmark: 1080p video read frames/s and peak RSS by video length, and the time to a frame near the end.

Usage: python bench/video_stream.py [--lengths 150 600] [--suffix .mp4] [--keep DIR]

A video of each length is written at 1920x1080, 30 fps (frames cycle through 10 rendered scene frames,
so writing stays quick), then read with metavlm_ros.footage.frames.iter_frames in a fresh
subprocess per video, which reports its frames/s and peak resident memory (VmHWM). Flat memory
across lengths shows streaming. Then, in another fresh subprocess, the time to the first frame
of `--start` one second before the end (the video is seeked, not decoded up to there).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

READER = """
import json, sys, time
import cv2
cv2.setNumThreads(1)
from metavlm_ros.footage.frames import iter_frames
start_s = float(sys.argv[2]) if len(sys.argv) > 2 else None
limit = 1 if start_s is not None else None
begin = time.perf_counter()
n = 0
for frame in iter_frames([sys.argv[1]], start=start_s, max_frames=limit):
    n += 1
    index = frame.index
seconds = time.perf_counter() - begin
hwm = 0
with open('/proc/self/status') as status:
    for line in status:
        if line.startswith('VmHWM:'):
            hwm = int(line.split()[1]) * 1024
print(json.dumps({'frames': n, 'seconds': seconds, 'peak_rss': hwm, 'last_index': index}))
"""


def write(path: Path, length: int) -> None:
    from metavlm_ros.footage.scenes import SceneGenerator
    from metavlm_ros.footage.video import write_video

    generator = SceneGenerator(1920, 1080, 30, seed=1, environment='shallow')
    scenes = [generator.frame(i)[0] for i in range(10)]
    write_video(path, (scenes[i % 10] for i in range(length)), fps=30.0)


def read(path: Path, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, '-c', READER, str(path), *extra], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--lengths', type=int, nargs='+', default=[150, 600])
    parser.add_argument('--suffix', default='.mp4')
    parser.add_argument('--keep', type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for length in args.lengths:
            path = where / f'video-{length}{args.suffix}'
            write(path, length)
            whole = read(path)
            seek = read(path, str(length / 30.0 - 1.0))
            rate, mib = whole['frames'] / whole['seconds'], 2**20
            print(
                f'{length} frames 1920x1080 ({path.stat().st_size / mib:.1f} MiB {args.suffix}): '
                f'{rate:.1f} frames/s, peak RSS {whole["peak_rss"] / mib:.0f} MiB; '
                f'--start {length / 30.0 - 1.0:g} s: frame {seek["last_index"]} after '
                f'{seek["seconds"]:.2f} s, peak RSS {seek["peak_rss"] / mib:.0f} MiB'
            )


if __name__ == '__main__':
    main()
