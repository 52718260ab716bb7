"""The catalogue finds the failure modes planted in a stand-in model, each as its own readable rule."""

from __future__ import annotations

import shlex

import cv2
import pytest

from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.cli import main
from metavlm_ros.explain.catalogue import CatalogueSettings, build_catalogue
from metavlm_ros.explain.changes import Change
from metavlm_ros.explain.features import feature_table, frame_attributes
from test.explain.planted import (
    BASE,
    DOWNSAMPLING_SCALE,
    DROP,
    RISE,
    ROTATION_DEG,
    PlantedBackend,
    planted_frame,
)

#: How near the planted thresholds a rule's must lie: the double sees a rotation to about 0.1 deg
#: (its markers' centroids) and the downsampling by whole repeated rows (1/120 of a scale each).
ROTATION_TOLERANCE_DEG = 0.5
SCALE_TOLERANCE = 0.02


@pytest.fixture(scope='module')
def table(planted_results):
    return feature_table(load_evidence(planted_results).runs)


@pytest.fixture(scope='module')
def catalogue(table):
    return build_catalogue(table, CatalogueSettings(threshold=0.05))


def _conditions(mode) -> dict:
    return {c.feature.name: c for c in mode.conditions}


def test_each_planted_mode_is_its_own_mode_and_nothing_else_is_among_the_top(catalogue):
    labels = [m.change.label for m in catalogue.modes]
    # Only the planted changes happen at all, and each is one mode: no fragment, no unplanted rule.
    assert set(catalogue.violations) == {'trash dropped', 'animal rose'}
    assert sorted(labels) == ['animal rose', 'trash dropped'], [m.rule for m in catalogue.modes]


def test_the_dark_rotation_mode_names_rotation_upwards_and_dark_frames(catalogue, table):
    (mode,) = [m for m in catalogue.modes if m.change == Change('dropped', 'trash')]
    conditions = _conditions(mode)
    assert set(conditions) == {'rotation', 'brightness'}, mode.rule
    rotation, brightness = conditions['rotation'], conditions['brightness']
    assert rotation.above and rotation.sign == '+'
    assert abs(rotation.value - ROTATION_DEG) <= ROTATION_TOLERANCE_DEG
    # Dark sources lie below the threshold, the others above it.
    dark = frame_attributes(planted_frame(0, 'dark'))['brightness']
    normal = frame_attributes(planted_frame(0, 'normal'))['brightness']
    assert not brightness.above and dark < brightness.threshold < normal
    assert mode.rate_inside >= 0.9 and mode.rate_outside <= 0.01
    assert mode.frames == 2 and mode.searches == 2  # the two dark frames
    assert mode.rule.startswith('brightness at most') and mode.rule.endswith(': trash dropped')


def test_the_downsampling_mode_names_downsampling_below_its_scale_on_every_frame(catalogue):
    (mode,) = [m for m in catalogue.modes if m.change == Change('rose', 'animal')]
    (condition,) = mode.conditions
    assert condition.feature.relation == 'downsampling'
    assert not condition.above and condition.sign == '-'
    assert abs(condition.value - DOWNSAMPLING_SCALE) <= SCALE_TOLERANCE
    assert mode.rate_inside >= 0.9 and mode.rate_outside <= 0.05
    assert mode.frames == 6 and mode.searches == 6
    record = mode.as_record(1)
    assert record['relations'] == ['downsampling'] and record['conditions'][0]['sign'] == '-'


def test_the_example_is_the_smallest_inside_and_renders_to_a_frame_with_the_change(
    catalogue, table, tmp_path
):
    for k, mode in enumerate(catalogue.modes):
        example = mode.example
        violating = [
            record['f_trans']
            for row, (_, record) in enumerate(table.records)
            if all(c.holds(table.column(c.feature.name)[row : row + 1])[0] for c in mode.conditions)
            and abs(record['followup'][mode.change.cls] - record['source'][mode.change.cls]) >= 0.05
        ]
        assert len(violating) == mode.violations_inside
        assert example['f_trans'] == min(violating)
        # The render command makes the follow-up again; the double, shown it, makes the change.
        out = tmp_path / f'mode{k}'
        argv = shlex.split(example['render'])[1:] + ['--out', str(out)]
        assert main(argv) == 0
        (png,) = sorted(out.rglob('*.png'))
        followup = cv2.cvtColor(cv2.imread(str(png)), cv2.COLOR_BGR2RGB)
        (answer,) = PlantedBackend().predict([followup])
        cls = mode.change.cls
        expected = BASE[cls] - DROP if mode.change.change == 'dropped' else BASE[cls] + RISE
        assert answer.values[cls] == pytest.approx(expected)


def test_the_catalogue_is_deterministic(table, catalogue):
    again = build_catalogue(table, CatalogueSettings(threshold=0.05))
    assert [m.as_record(1) for m in again.modes] == [m.as_record(1) for m in catalogue.modes]


def test_a_mode_holds_enough_violations_much_likelier_inside_than_outside(table):
    # A mode needs its violations; fewer modes than found keeps the best.
    assert build_catalogue(table, CatalogueSettings(min_violations=10_000)).modes == []
    # Every mode kept is at least min_lift times likelier inside its rule than outside.
    settings = CatalogueSettings(min_lift=3.0)
    for mode in build_catalogue(table, settings).modes:
        assert mode.rate_inside >= settings.min_lift * mode.rate_outside
    (best,) = build_catalogue(table, CatalogueSettings(max_modes=1)).modes
    assert best.change == Change('rose', 'animal')  # more violations explained
