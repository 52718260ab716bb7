"""Tests of `metavlm scenes` through metavlm_ros.cli.main."""

import json
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError
from metavlm_ros.footage.bags import (
    COMPRESSED_TOPIC,
    IMAGE_TOPIC,
    RANGES_TOPIC,
    iter_bag_frames,
    list_image_topics,
    read_ground_truth,
)
from metavlm_ros.footage.frames import iter_frames
from metavlm_ros.footage.ranges import RangeLookup, scene_ranges, write_ranges_png
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.footage.truth import caption

SMALL = ['--frames', '3', '--size', '64x48', '--fps', '5', '--seed', '4', '--environment', 'deep']


def test_mcap_output_is_one_bag_file_of_that_name(tmp_path, capsys):
    assert main(['scenes', '--out', str(tmp_path / 'demo.mcap'), *SMALL]) == 0
    bag = tmp_path / 'demo.mcap'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['demo.mcap']  # no scratch left, no directory
    assert bag.is_file()
    assert str(bag) in capsys.readouterr().out
    gen = SceneGenerator(64, 48, 5, seed=4, environment='deep')
    frames = list(iter_bag_frames(bag))
    assert len(frames) == 3
    assert frames[0].id.startswith('demo@')
    for i, frame in enumerate(frames):
        np.testing.assert_array_equal(frame.rgb, gen.frame(i)[0])
    assert [gt.to_dict() for _, gt in read_ground_truth(bag)] == [gen.frame(i)[1].to_dict() for i in range(3)]


def test_db3_output_is_one_sqlite_bag_with_its_metadata_inside(tmp_path):
    import sqlite3

    bag = tmp_path / 'demo.db3'
    assert main(['scenes', '--out', str(bag), *SMALL]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ['demo.db3']
    # rosbag2 (Iron and newer) reads a lone .db3 through this table: the metadata travels inside.
    with sqlite3.connect(f'file:{bag}?mode=ro', uri=True) as db:
        (text,) = db.execute('SELECT metadata FROM metadata').fetchone()
    assert 'relative_file_paths' in text and 'demo.db3' in text
    frames = list(iter_bag_frames(bag))
    assert len(frames) == 3
    assert all(RangeLookup()(frame).shape == (48, 64) for frame in frames)  # each frame's range map


@pytest.mark.parametrize('compressed', [False, True])
def test_bag_output_is_a_ros1_bag_read_as_the_rosbag2_one(tmp_path, capsys, compressed):
    from rosbags.rosbag1 import Reader

    bag = tmp_path / 'dive.bag'
    assert main(['scenes', '--out', str(bag), *SMALL, *(['--compressed'] if compressed else [])]) == 0
    assert f'ROS 1 bag {bag}' in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ['dive.bag']
    with Reader(bag) as reader:  # rosbags' own ROS 1 reader, as rosbag on Noetic would read it
        types = {c.topic: c.msgtype for c in reader.connections}
        digests = {c.msgtype: c.digest for c in reader.connections}
    image_topic = COMPRESSED_TOPIC if compressed else IMAGE_TOPIC
    assert types[image_topic] == (
        'sensor_msgs/msg/CompressedImage' if compressed else 'sensor_msgs/msg/Image'
    )
    assert types['/camera/camera_info'] == 'sensor_msgs/msg/CameraInfo'
    assert types[RANGES_TOPIC] == 'sensor_msgs/msg/CompressedImage'  # range maps, as ROS 1 carries depth
    # The md5sums rosbag on Noetic checks a subscriber's type against.
    assert digests['sensor_msgs/msg/CameraInfo'] == 'c9a58c1b0b154e0e6da7578cb991d214'
    if not compressed:
        assert digests['sensor_msgs/msg/Image'] == '060021388200f6f0f447d0fcd9c64743'
    gen = SceneGenerator(64, 48, 5, seed=4, environment='deep')
    frames = list(iter_bag_frames(bag))
    assert [f.id for f in frames] == [f'dive@{1_767_225_600_000_000_000 + i * 200_000_000}' for i in range(3)]
    for i, frame in enumerate(frames):
        if compressed:
            assert np.abs(frame.rgb.astype(int) - gen.frame(i)[0].astype(int)).mean() < 6
        else:
            np.testing.assert_array_equal(frame.rgb, gen.frame(i)[0])
    assert [gt.to_dict() for _, gt in read_ground_truth(bag)] == [gen.frame(i)[1].to_dict() for i in range(3)]
    lookup = RangeLookup()
    for i, frame in enumerate(frames):
        _, _, labels = gen.render(i)
        assert np.abs(lookup(frame) - scene_ranges(gen, i, labels)).max() <= 0.001  # deep: no open water
    # Reproducible from the seed, and refused over anything but a ROS 1 bag.
    assert main(['scenes', '--out', str(tmp_path / 'again.bag'), *SMALL]) == 0
    if not compressed:
        assert (tmp_path / 'again.bag').read_bytes() == bag.read_bytes()
    assert main(['scenes', '--out', str(bag), *SMALL]) == 2
    (tmp_path / 'notes.bag').write_text('precious')
    assert main(['scenes', '--out', str(tmp_path / 'notes.bag'), '--overwrite', *SMALL]) == 2
    assert 'is not a ROS 1 bag' in capsys.readouterr().err
    assert (tmp_path / 'notes.bag').read_text() == 'precious'


@pytest.mark.parametrize('suffix', ['.mp4', '.mkv', '.avi', '.mov'])
def test_video_output_reads_back_frame_by_frame(tmp_path, capsys, suffix):
    from metavlm_ros.footage.frames import iter_frames

    video = tmp_path / f'dive{suffix}'
    assert main(['scenes', '--out', str(video), *SMALL]) == 0
    assert f'video {video}' in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [video.name]
    gen = SceneGenerator(64, 48, 5, seed=4, environment='deep')
    frames = list(iter_frames([video]))
    assert [f.stamp_ns for f in frames] == [0, 200_000_000, 400_000_000]
    for i, frame in enumerate(frames):  # lossy codecs: close to the scene, not equal
        assert np.abs(frame.rgb.astype(int) - gen.frame(i)[0].astype(int)).mean() < 12
    assert main(['scenes', '--out', str(video), *SMALL]) == 2
    assert main(['scenes', '--out', str(video), '--overwrite', *SMALL]) == 0


def test_directory_output_sqlite_compressed(tmp_path):
    out = tmp_path / 'demo_bag'
    assert main(['scenes', '--out', f'{out}/', '--storage', 'sqlite3', '--compressed', *SMALL]) == 0
    assert sorted(p.name for p in out.iterdir()) == ['demo_bag.db3', 'metadata.yaml']
    assert list_image_topics(out) == [COMPRESSED_TOPIC]
    assert len(list(iter_bag_frames(out))) == 3


def test_existing_output_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / 'demo.mcap'
    assert main(['scenes', '--out', str(out), *SMALL]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(['scenes', '--out', str(out), *SMALL[:-2], '--environment', 'pool']) == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and 'already exists' in err and err.count('\n') == 1
    assert out.read_bytes() == before
    assert main(['scenes', '--out', str(out), '--overwrite', *SMALL[:-2], '--environment', 'pool']) == 0
    assert out.read_bytes() != before
    assert list_image_topics(out) == [IMAGE_TOPIC]
    # A file that is not a bag is never replaced, even with --overwrite.
    notes = tmp_path / 'notes.mcap'
    notes.write_text('not a bag')
    capsys.readouterr()
    assert main(['scenes', '--out', str(notes), '--overwrite', *SMALL]) == 2
    assert 'not a mcap bag' in capsys.readouterr().err
    assert notes.read_text() == 'not a bag'


def test_a_bag_left_half_written_by_a_killed_run_is_removed_by_the_next_one(tmp_path):
    dead = subprocess.run([sys.executable, '-c', 'print(__import__("os").getpid())'], capture_output=True)
    scratch = tmp_path / f'.demo.mcap.partial-{int(dead.stdout)}-1a2b3c4d'
    (scratch / 'demo').mkdir(parents=True)
    (scratch / 'demo' / 'demo.mcap').write_bytes(b'\x89MCAP0\r\n cut')
    assert main(['scenes', '--out', str(tmp_path / 'demo.mcap'), *SMALL]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ['demo.mcap']


def test_png_folder(tmp_path):
    out = tmp_path / 'pngs'
    assert main(['scenes', '--out', str(out), '--format', 'png', *SMALL]) == 0
    names = sorted(p.name for p in out.iterdir())
    frames = ['frame_000000.png', 'frame_000001.png', 'frame_000002.png']
    assert names == [*frames, 'ground_truth.jsonl', 'ranges']
    assert sorted(p.name for p in (out / 'ranges').iterdir()) == frames
    records = [json.loads(line) for line in (out / 'ground_truth.jsonl').read_text().splitlines()]
    gen = SceneGenerator(64, 48, 5, seed=4, environment='deep')
    for i, record in enumerate(records):
        rgb, gt = gen.frame(i)
        assert record['file'] == f'frame_{i:06d}.png'
        assert record['stamp_ns'] == i * 200_000_000
        assert record['caption'] == caption(gt)
        assert record['counts'] == gt.counts and record['boxes'] == gt.to_dict()['boxes']
        png = cv2.cvtColor(cv2.imread(str(out / record['file'])), cv2.COLOR_BGR2RGB)
        np.testing.assert_array_equal(png, rgb)
    assert main(['scenes', '--out', str(out), '--format', 'png', *SMALL]) == 2
    assert main(['scenes', '--out', str(out), '--format', 'png', '--overwrite', *SMALL]) == 0
    assert sorted(p.name for p in out.iterdir()) == names


def test_png_folder_ranges_are_found_for_its_frames(tmp_path, capsys):
    out = tmp_path / 'pngs'
    assert main(['scenes', '--out', str(out), '--format', 'png', *SMALL]) == 0
    assert 'ranges/frame_*.png' in capsys.readouterr().out
    frames = list(iter_frames(out))
    assert [f.id for f in frames] == ['frame_000000', 'frame_000001', 'frame_000002']  # not ranges/
    gen = SceneGenerator(64, 48, 5, seed=4, environment='deep')
    lookup = RangeLookup()
    for i, frame in enumerate(frames):
        ranges = lookup(frame)
        assert ranges.shape == (48, 64) and ranges.dtype == np.float32
        _, _, labels = gen.render(i)
        true = scene_ranges(gen, i, labels)
        assert (np.isinf(ranges) == np.isinf(true)).all()
        finite = np.isfinite(true)
        assert np.abs(ranges - np.minimum(true, 65.534))[finite].max() <= 0.001
    # A scenes folder of an earlier version, without ranges/, has none; a map of another size is refused.
    shutil.rmtree(out / 'ranges')
    assert lookup(frames[0]) is None
    (out / 'ranges').mkdir()
    write_ranges_png(out / 'ranges' / 'frame_000000.png', np.ones((24, 32), np.float32))
    with pytest.raises(InputError, match='range map is 32x24, its frame frame_000000.png is 64x48'):
        lookup(frames[0])


def test_same_seed_same_bag_bytes(tmp_path):
    assert main(['scenes', '--out', str(tmp_path / 'a' / 'demo.mcap'), *SMALL]) == 0
    assert main(['scenes', '--out', str(tmp_path / 'b' / 'demo.mcap'), *SMALL]) == 0
    first = (tmp_path / 'a' / 'demo.mcap').read_bytes()
    assert first == (tmp_path / 'b' / 'demo.mcap').read_bytes()
    assert main(['scenes', '--out', str(tmp_path / 'c' / 'demo.mcap'), *SMALL[:-4], '--seed', '5']) == 0
    assert (tmp_path / 'c' / 'demo.mcap').read_bytes() != first


@pytest.mark.parametrize(
    'extra',
    [
        ['--size', '64by48'],
        ['--size', '8x8'],
        ['--frames', '0'],
        ['--fps', '0'],
        ['--storage', 'sqlite3'],  # contradicts the .mcap suffix
        ['--out-name', 'x.bag', '--storage', 'mcap'],  # a ROS 1 bag has no rosbag2 storage
        ['--out-name', 'x.mp4', '--compressed'],
        ['--out-name', 'x.webm'],  # read, not written
        ['--out-name', 'x.mcap', '--format', 'video'],
        ['--out-name', 'x.mp4', '--size', '63x47'],  # 4:2:0 video: FFmpeg would crop to 62x46
    ],
)
def test_bad_arguments(tmp_path, capsys, extra):
    name = extra[1] if extra[0] == '--out-name' else 'x.mcap'
    extra = extra[2:] if extra[0] == '--out-name' else extra
    code = main(['scenes', '--out', str(tmp_path / name), '--frames', '2', '--size', '64x48', *extra])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and err.count('\n') == 1
    assert list(tmp_path.iterdir()) == []


def test_png_rejects_bag_options(tmp_path, capsys):
    assert main(['scenes', '--out', str(tmp_path / 'p'), '--format', 'png', '--compressed', *SMALL]) == 2
    assert 'apply to bags' in capsys.readouterr().err
    assert main(['scenes', '--out', str(tmp_path / 'p.mcap'), '--format', 'png', *SMALL]) == 2
    assert 'names a bag file' in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    folder = tmp_path / 'mine'
    folder.mkdir()
    (folder / 'thesis.tex').write_text('precious')
    assert main(['scenes', '--out', str(folder), '--format', 'png', '--overwrite', *SMALL]) == 2
    assert main(['scenes', '--out', str(folder), '--overwrite', *SMALL]) == 2
    assert (folder / 'thesis.tex').read_text() == 'precious'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mine']


@pytest.mark.parametrize('output', [['sub.mcap'], ['sub.db3'], ['sub', '--format', 'png']])
def test_an_output_below_a_file_gets_one_line(tmp_path, capsys, output):
    (tmp_path / 'afile').write_text('x')
    name, *options = output
    for parent in ('afile', 'afile/deeper'):
        assert main(['scenes', '--out', str(tmp_path / parent / name), *options, *SMALL]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('metavlm: error:') and 'is a file, not a directory' in err and '\n' not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['afile']


def _tree(path):
    """The bytes of a file, or of every file of a folder."""
    if path.is_file():
        return path.read_bytes()
    return {p.name: _tree(p) for p in sorted(path.iterdir())}


@pytest.mark.parametrize('output', [['x.mcap'], ['x.db3'], ['x', '--format', 'png'], ['x.bag'], ['x.mkv']])
def test_a_full_disk_gives_one_line_and_keeps_the_earlier_output(tmp_path, capsys, output):
    import resource

    name, *options = output
    target = tmp_path / name
    big = ['--frames', '12', '--size', '320x240', '--seed', '4']
    assert main(['scenes', '--out', str(tmp_path / name), *options, *SMALL]) == 0
    before = _tree(target)
    capsys.readouterr()
    # Writes past 16 KB fail with EFBIG, as they fail with ENOSPC on a full disk.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, hard))
    try:
        code = main(['scenes', '--out', str(tmp_path / name), *options, *big, '--overwrite'])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2
    assert err.startswith('metavlm: error:') and 'cannot write footage' in err and '\n' not in err
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
