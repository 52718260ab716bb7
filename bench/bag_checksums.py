"""Benchmark: what bag checksums cost, writing (mcap chunk CRCs, message digest) and verifying.

Usage: python bench/bag_checksums.py [--frames 20] [--size 1920x1080] [--storage mcap] [--repeats 3]
Writes the same synthetic frames as a bag with rosbags' own writer (chunk CRC 0, no digest) and with
`write_bag` (CRCs and digest), interleaved; then times `verify_bag` (every message read, checked
against the checksums) against reading every frame decoded, as a search of the bag does anyway.
Checks: the checksummed bag verifies, the plain one has CRC 0, a damaged copy is refused.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved  # noqa: E402

from metavlm_ros.common.errors import BagError
from metavlm_ros.footage import bag_writer, bags
from metavlm_ros.footage.scenes import SceneGenerator


class _NoDigest:
    """What writing cost before digests: nothing."""

    def update(self, *args: object) -> None:
        pass

    def hexdigest(self) -> str:
        return ''


def _write_plain(path: Path, frames: list, storage: str) -> None:
    from rosbags.rosbag2 import Writer

    # write_bag looks both up in its own module at each call.
    checksummed, digest = bag_writer._checksummed_writer, bag_writer.MessageDigest
    bag_writer._checksummed_writer, bag_writer.MessageDigest = (lambda: Writer), _NoDigest
    try:
        bags.write_bag(path, frames, fps=10.0, storage=storage, overwrite=True)
    finally:
        bag_writer._checksummed_writer, bag_writer.MessageDigest = checksummed, digest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=20)
    parser.add_argument('--size', default='1920x1080')
    parser.add_argument('--storage', default='mcap', choices=bags.STORAGES)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split('x'))
    generator = SceneGenerator(width, height, 10.0, seed=3, frames=args.frames)
    frames = [generator.frame(i) for i in range(args.frames)]
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as root:
        root = Path(root)
        plain, checked = root / 'plain', root / 'checked'
        writes = interleaved(
            {
                'rosbags writer (CRC 0, no digest)': lambda: _write_plain(plain, frames, args.storage),
                'write_bag (chunk CRCs, digest)': lambda: bags.write_bag(
                    checked, frames, fps=10.0, storage=args.storage, overwrite=True
                ),
            },
            args.repeats,
        )
        size = sum(p.stat().st_size for p in checked.rglob('*') if p.is_file())
        reads = interleaved(
            {
                'verify_bag (every message, checksums)': lambda: bags.verify_bag(checked),
                'iter_bag_frames (every frame decoded)': lambda: sum(
                    1 for _ in bags.iter_bag_frames(checked)
                ),
            },
            args.repeats,
        )
        what = f'{args.frames} frames {width}x{height}, {args.storage}, {size / 2**20:.0f} MiB'
        print(f'{what}; seconds min / median / max')
        for name, values in {**writes, **reads}.items():
            print(f'  {name:42s} {fmt(values, digits=3)}')

        checks.check(bags.verify_bag(checked) is None, 'the checksummed bag verifies')
        if args.storage == 'mcap':
            from mcap.records import Chunk
            from mcap.stream_reader import StreamReader

            def crcs(bag: Path) -> list[int]:
                with open(bag / f'{bag.name}.mcap', 'rb') as stream:
                    records = StreamReader(stream, emit_chunks=True, validate_crcs=True).records
                    return [r.uncompressed_crc for r in records if isinstance(r, Chunk)]

            checks.check(set(crcs(plain)) == {0}, 'rosbags writes chunk CRC 0')
            checks.check(0 not in crcs(checked), 'write_bag writes every chunk CRC')
        damaged = root / 'damaged' / checked.name
        shutil.copytree(checked, damaged)
        (storage_file,) = [p for p in damaged.iterdir() if p.suffix in ('.mcap', '.db3')]
        data = bytearray(storage_file.read_bytes())
        pixels = frames[args.frames // 2][0].tobytes()
        # 256 bytes from the middle of one frame: sqlite3 splits a frame's row over pages.
        start = data.find(pixels[len(pixels) // 2 : len(pixels) // 2 + 256])
        checks.check(start >= 0, 'the frame is found in the storage file')
        data[start : start + 200] = bytes(200)
        storage_file.write_bytes(bytes(data))
        try:
            bags.verify_bag(damaged)
            refused = False
        except BagError:
            refused = True
        checks.check(refused, 'a copy with 200 bytes of one frame overwritten is refused')
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
