"""The features a failure mode can name: where the footage has ground truth, the number of objects and
the size and place of the largest, read from its own ground_truth.jsonl."""

import json

import pytest

from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.cli import main
from metavlm_ros.explain.features import TRUTH_ATTRIBUTES, feature_table


def test_objects_of_the_ground_truth_are_features_of_every_evaluation(tmp_path, tiny_clip_dir):
    scenes = ['scenes', '--out', str(tmp_path / 'pngs'), '--format', 'png', '--frames', '2']
    assert main([*scenes, '--size', '160x90', '--seed', '4']) == 0
    search = ['search', str(tmp_path / 'pngs'), '--model', str(tiny_clip_dir), '--out', str(tmp_path / 's')]
    assert main([*search, '--population', '4', '--evaluations', '8']) == 0
    table = feature_table(load_evidence(tmp_path / 's').runs)
    names = [f.name for f in table.features]
    assert set(TRUTH_ATTRIBUTES) <= set(names)
    lines = (tmp_path / 'pngs' / 'ground_truth.jsonl').read_text().splitlines()
    truths = {json.loads(line)['file']: json.loads(line) for line in lines}
    assert len(table.records) > 0
    for row, (_, record) in zip(table.values, table.records, strict=True):
        truth = truths[f'{record["image"]}.png']
        largest = max(truth['boxes'], key=lambda b: b['area'])
        x0, y0, x1, y1 = largest['box']
        expected = [len(truth['boxes']), largest['area'], (x0 + x1) / 320, (y0 + y1) / 180]
        got = [row[names.index(name)] for name in TRUTH_ATTRIBUTES]
        assert got == pytest.approx(expected)


def test_without_ground_truth_there_are_no_object_features(tmp_path, tiny_clip_dir):
    from test.conftest import write_frames

    write_frames(tmp_path / 'plain', 1, 64, 48)
    search = ['search', str(tmp_path / 'plain'), '--model', str(tiny_clip_dir), '--out', str(tmp_path / 's')]
    assert main([*search, '--population', '4', '--evaluations', '8']) == 0
    table = feature_table(load_evidence(tmp_path / 's').runs)
    assert not set(TRUTH_ATTRIBUTES) & {f.name for f in table.features}
