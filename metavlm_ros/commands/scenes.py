"""`metavlm scenes`: synthetic SeaClear-like underwater footage with ground truth: a bag, a video or PNGs."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.results import check_output_dir, storage_error
from metavlm_ros.common.scratch import remove_stale, scratch_path
from metavlm_ros.footage.ground_truth import GROUND_TRUTH_FILE

HELP = 'write synthetic underwater footage with ground truth (a ROS 2 or ROS 1 bag, a video, or PNGs)'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `scenes` subcommand."""
    parser = subparsers.add_parser(
        'scenes',
        help=HELP,
        description=HELP + '. The bag gets the name given: --out X.mcap (or X.db3) writes the single-file '
        'bag X.mcap, which every metavlm command, the launch files and `ros2 bag play X.mcap` read under '
        'that name; --out X.bag a ROS 1 bag (Noetic message definitions); --out X.mp4 (.mkv, .avi, .mov) a '
        'video, without ground truth or ranges; any other --out is a rosbag2 bag directory (metadata.yaml '
        "and DIR/DIR.mcap). Bags and PNG folders hold each frame's range map (bags: a 16UC1 compressedDepth "
        'image on /camera/depth/image_raw/compressedDepth), which --water-ranges truth reads.',
    )
    parser.add_argument(
        '--out',
        required=True,
        metavar='PATH',
        help='demo.mcap, demo.db3, demo.bag (ROS 1), demo.mp4 (.mkv, .avi, .mov), a bag directory, or a '
        'folder (--format png)',
    )
    parser.add_argument(
        '--format',
        choices=('bag', 'video', 'png'),
        default=None,
        help='bag (the default; ROS 1 for --out X.bag), video (the default for a video --out) or PNG files '
        '+ ground_truth.jsonl',
    )
    parser.add_argument(
        '--frames', type=int, default=100, metavar='N', help='number of frames (default: 100)'
    )
    parser.add_argument('--fps', type=float, default=10.0, metavar='F', help='frame rate (default: 10)')
    parser.add_argument('--size', default='1920x1080', metavar='WxH', help='frame size (default: 1920x1080)')
    parser.add_argument('--seed', type=int, default=0, help='scene seed (default: 0)')
    parser.add_argument(
        '--environment', choices=('pool', 'shallow', 'deep'), default=None, help='default: chosen by the seed'
    )
    parser.add_argument(
        '--compressed', action='store_true', help='JPEG CompressedImage instead of raw rgb8 Image (bags)'
    )
    parser.add_argument(
        '--storage',
        choices=('mcap', 'sqlite3'),
        default=None,
        help='rosbag2 storage (default: from --out, else mcap)',
    )
    parser.add_argument('--overwrite', action='store_true', help='replace an existing output')
    parser.set_defaults(handler=run)


def parse_size(text: str) -> tuple[int, int]:
    """'1920x1080' -> (1920, 1080).

    Raises:
        ParameterError: Not of the form WxH with positive integers.
    """
    match = re.fullmatch(r'\s*(\d+)\s*[xX]\s*(\d+)\s*', text or '')
    if not match:
        raise ParameterError(f'--size must look like 1920x1080, got {text!r}')
    return int(match.group(1)), int(match.group(2))


def _progress(total: int, unit: str = 'frame'):
    from tqdm import tqdm

    # disable=None: a bar on a terminal, silence in logs and pipes.
    return tqdm(total=total, unit=unit, desc='scenes', disable=None, dynamic_ncols=True)


def run(args: argparse.Namespace) -> int:
    """Generate the footage; returns 0."""
    from metavlm_ros.footage.bags import RANGES_TOPIC
    from metavlm_ros.footage.ranges import render_with_ranges
    from metavlm_ros.footage.scenes import SceneGenerator

    width, height = parse_size(args.size)
    if args.frames < 1:
        raise ParameterError(f'--frames must be >= 1, got {args.frames}')
    if not args.fps or args.fps <= 0:
        raise ParameterError(f'--fps must be > 0, got {args.fps}')
    from metavlm_ros.footage.video import VIDEO_SUFFIXES, WRITE_CODECS

    suffix = Path(args.out).suffix.lower()
    form = args.format or ('video' if suffix in VIDEO_SUFFIXES else 'bag')
    if form != 'bag' and (args.compressed or args.storage):
        raise ParameterError(f'--compressed and --storage apply to bags, not to --format {form}')
    if form == 'png' and suffix in ('.mcap', '.db3', '.bag'):
        raise ParameterError(f'--format png writes a folder; {args.out} names a bag file')
    if form == 'video' and suffix not in WRITE_CODECS:
        raise ParameterError(f'--format video: --out must end in {", ".join(WRITE_CODECS)}, got {args.out}')
    if form == 'bag' and suffix == '.bag' and args.storage:
        raise ParameterError(f'--storage is for rosbag2 bags; {args.out} is a ROS 1 bag')
    # The output location is checked before any frame is made: a file in the path, a read-only disk.
    check_output_dir(Path(args.out).absolute().parent, what='footage')  # the output is made beside it
    generator = SceneGenerator(
        width, height, args.fps, args.seed, environment=args.environment, frames=args.frames
    )
    bar = _progress(args.frames)

    def frames() -> Iterator[tuple[np.ndarray, object]]:
        for item in generator:
            yield item
            bar.update(1)

    def ranged() -> Iterator[tuple[np.ndarray, object, np.ndarray]]:
        for index in range(args.frames):
            yield render_with_ranges(generator, index)  # one render: pixels, truth and ranges
            bar.update(1)

    try:
        if form == 'png':
            from metavlm_ros.footage.ranges import RANGES_DIR

            out = write_png_folder(Path(args.out), ranged(), fps=args.fps, overwrite=args.overwrite)
            what = f'{out}/ (frame_*.png, {GROUND_TRUTH_FILE}, {RANGES_DIR}/frame_*.png)'
        elif form == 'video':
            from metavlm_ros.footage.video import write_video

            out = write_video(args.out, (rgb for rgb, _ in frames()), fps=args.fps, overwrite=args.overwrite)
            what = f'video {out} ({WRITE_CODECS[suffix]}; no ground truth)'
        elif suffix == '.bag':
            from metavlm_ros.footage.bags import write_bag

            out = write_bag(
                args.out, ranged(), fps=args.fps, compressed=args.compressed, overwrite=args.overwrite
            )
            what = f'ROS 1 bag {out} (range maps on {RANGES_TOPIC})'
        else:
            from metavlm_ros.footage.bags import resolve_bag_output, write_bag

            bag_dir, storage = resolve_bag_output(args.out, args.storage)
            out = write_bag(
                bag_dir,
                ranged(),
                fps=args.fps,
                storage=storage,
                compressed=args.compressed,
                overwrite=args.overwrite,
            )
            if out.is_dir():
                suffix = '.mcap' if storage == 'mcap' else '.db3'
                what = f'bag {out}/ ({out.name}{suffix}, metadata.yaml; range maps on {RANGES_TOPIC})'
            else:
                what = f'bag {out} ({storage}, one file; range maps on {RANGES_TOPIC})'
    except (OSError, sqlite3.DatabaseError) as exc:
        # A full or read-only disk: the footage is written aside and renamed in only when complete,
        # so nothing of it is left, and an earlier output of that name is untouched.
        if not isinstance(exc, OSError):
            exc = OSError(str(exc))  # sqlite3 storage: 'database or disk is full'
        raise storage_error(args.out, exc, 'footage', 'nothing of it was kept') from None
    finally:
        bar.close()
    print(
        f'wrote {args.frames} frames {width}x{height} at {args.fps:g} fps, {generator.environment} scene '
        f'(seed {args.seed}), to {what}'
    )
    return 0


def write_png_folder(out: Path, frames, *, fps: float, overwrite: bool = False) -> Path:
    """Write frames as frame_000000.png ... plus ground_truth.jsonl (one JSON line per frame).

    Each line holds 'file', 'stamp_ns' (time since the first frame), 'caption' and the fields of
    GroundTruth.to_dict(). `frames` yields (rgb, ground truth) or (rgb, ground truth, ranges); a
    frame's range map is written as ranges/<its file name> (footage/ranges.py). The folder appears
    only when complete.

    Raises:
        InputError: `out` exists (without overwrite), or is not a folder this command wrote.
    """
    from metavlm_ros.footage.ranges import RANGES_DIR, write_ranges_png
    from metavlm_ros.footage.truth import caption

    if out.exists():
        if not overwrite:
            raise InputError(f'{out}: already exists (use --overwrite to replace it)')
        if not out.is_dir() or (any(out.iterdir()) and not (out / GROUND_TRUTH_FILE).is_file()):
            raise InputError(f'{out}: exists and is not a scenes folder; refusing to replace it')
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent, out.name)  # what a killed run of this command left
    tmp = scratch_path(out)
    tmp.mkdir()
    try:
        with open(tmp / GROUND_TRUTH_FILE, 'w', encoding='utf-8') as lines:
            for index, (rgb, gt, *ranges) in enumerate(frames):
                name = f'frame_{index:06d}.png'
                # Encoded here and written by Python: a full disk is an OSError, not libpng's noise.
                (tmp / name).write_bytes(encode_png(rgb))
                if ranges:
                    (tmp / RANGES_DIR).mkdir(exist_ok=True)
                    write_ranges_png(tmp / RANGES_DIR / name, ranges[0])
                record = {
                    'file': name,
                    'stamp_ns': round(index * 1e9 / fps),
                    'caption': caption(gt),
                    **gt.to_dict(),
                }
                lines.write(json.dumps(record) + '\n')
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
