"""Detections through the search: a stand-in detector searched as any model, its boxes in the records.

The records are read back as users read them (pandas, DuckDB) and each evaluation's f_pred and
violation are judged again from what the record holds: the expected boxes and the follow-up's.
"""

import cv2
import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, ResultsStore, read_jsonl, records_file
from metavlm_ros.method.answers import ANSWERS, iou_key
from metavlm_ros.method.boxes import Detection, ExpectedBox, compare_detections
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import boundaries, directions, violated
from metavlm_ros.method.search import SearchConfig, run_search
from test.fakes import ThresholdDetector
from test.tools_reading import as_jq_reads, jq_records, same_as_ours


def _scene(width: int = 320, height: int = 240) -> np.ndarray:
    """Dark water with four bright objects, one of each class the stand-in detector tells apart."""
    frame = np.full((height, width, 3), (15, 50, 70), np.uint8)
    s = width / 320
    cv2.ellipse(frame, (int(60 * s), int(60 * s)), (int(22 * s), int(14 * s)), 20, 0, 360, (230, 40, 40), -1)
    cv2.rectangle(frame, (int(200 * s), int(40 * s)), (int(240 * s), int(90 * s)), (40, 220, 60), -1)
    cv2.circle(frame, (int(160 * s), int(170 * s)), int(25 * s), (50, 60, 230), -1)
    cv2.ellipse(
        frame, (int(270 * s), int(200 * s)), (int(18 * s), int(10 * s)), -30, 0, 360, (200, 200, 190), -1
    )
    return frame


@pytest.fixture(scope='module')
def searched(tmp_path_factory):
    """One NSGA-II search of the scene over the paper's relations and turbidity, stored."""
    out = tmp_path_factory.mktemp('detections') / 'search'
    paper = ['rotation', 'scaling', 'histogram_equalization', 'downsampling', 'shear', 'translation']
    space = SearchSpace.from_options([*paper, 'turbidity'])
    config = SearchConfig(algorithm='nsga2', population=12, evaluations=96, seed=3, space=space)
    with ResultsStore(out) as store:
        result = run_search(_scene(), ThresholdDetector(), config, image_id='scene', store=store)
    return out, result


def test_the_stand_in_detector_finds_each_object_of_the_scene():
    (prediction,) = ThresholdDetector().predict([_scene()])
    assert prediction.kind == 'detection' and not prediction.error
    assert sorted(d.cls for d in prediction.detections) == ['animal', 'object', 'trash', 'vegetation']
    assert prediction.values == {'animal': 1.0, 'vegetation': 1.0, 'object': 1.0, 'trash': 1.0}


def test_records_carry_the_boxes_and_pandas_and_duckdb_read_them(searched):
    out, result = searched
    same_as_ours(out)
    records = read_jsonl(out / EVALUATIONS)
    assert len(records) == 96 and {r['kind'] for r in records} == {'detection'}
    assert all(set(r['violation']) == {iou_key(0.5)} for r in records)
    judged = [r for r in records if not r['failed'] and r['order'] > 0]
    assert judged and all(isinstance(r['followup_detections'], list) and r['boxes'] for r in judged)
    (summary,) = read_jsonl(out / SUMMARY)
    assert sorted(d['class'] for d in summary['source_detections']) == [
        'animal',
        'object',
        'trash',
        'vegetation',
    ]
    # The hypervolume normalises f_pred by 1 (1 - panoptic quality), not by the number of classes.
    assert 0 < result.hypervolume <= 1
    # DuckDB answers what an engineer asks of them: which searches lost which objects.
    import duckdb

    path = records_file(out / EVALUATIONS)
    lost = duckdb.sql(f"SELECT count(*) FROM read_json('{path}') WHERE len(boxes.lost) > 0").fetchall()[0][0]
    assert lost == sum(bool(r['boxes'] and r['boxes']['lost']) for r in records)
    # jq (docs/results.md) too: the boxes found on each violating follow-up, as written.
    program = 'select(.violation["iou0.5"]) | {index, found: [.followup_detections[] | .box]}'
    expected = [
        {'index': r['index'], 'found': [d['box'] for d in r['followup_detections']]}
        for r in records
        if r['violation']['iou0.5']
    ]
    assert expected and jq_records(path, program) == as_jq_reads(expected)


def test_each_records_f_pred_and_violation_follow_from_the_boxes_it_holds(searched):
    out, _ = searched
    records = [r for r in read_jsonl(out / EVALUATIONS) if not r['failed'] and r['order'] > 0]
    violations = 0
    for r in records:
        expected = [
            ExpectedBox(e['class'], tuple(e['box']), tuple(e['inner']), e['required'], k)
            for k, e in enumerate(r['boxes']['expected'])
        ]
        found = [Detection.from_record(d) for d in r['followup_detections']]
        match = compare_detections(expected, found, 0.5)
        # Within 1e-4: the record rounds its boxes to a thousandth of a pixel.
        assert match.f_pred == pytest.approx(r['f_pred'], abs=1e-4), r['composition']
        assert match.violation == r['violation']['iou0.5'], r['composition']
        violations += match.violation
        assert r['strength']['iou0.5'] == (pytest.approx(r['f_pred']) if match.violation else None)
    # The stand-in is equivariant but thresholds grey levels: the search breaks it (turbid water,
    # CLAHE, a black border merged into a blob) and keeps some compositions clean.
    assert 0 < violations < len(records)


def test_boxes_are_recorded_in_source_frame_pixels_when_the_search_works_smaller(tmp_path):
    config = SearchConfig(algorithm='random', population=6, evaluations=12, seed=0, working_size=320)
    frame = _scene(640, 480)
    with ResultsStore(tmp_path / 'out') as store:
        result = run_search(frame, ThresholdDetector(), config, image_id='big', store=store)
    assert result.working_size == 320 and result.source_size == (640, 480)
    (summary,) = read_jsonl(tmp_path / 'out' / SUMMARY)
    seen = {d.cls: d.box for d in result.source.detections}  # at the working size
    for d in summary['source_detections']:
        assert d['box'] == pytest.approx([2 * v for v in seen[d['class']]])
    for r in read_jsonl(tmp_path / 'out' / EVALUATIONS):
        for e in r['boxes']['expected'] if r['boxes'] else []:
            assert all(0 <= v <= 640 for v in e['box'][::2]) and all(0 <= v <= 480 for v in e['box'][1::2])


def test_every_kind_of_answer_is_declared_once():
    assert set(ANSWERS) == {'count', 'confidence', 'detection'}
    config = SearchConfig()
    assert ANSWERS['count'].keys(config.criteria) == ('count',)
    assert ANSWERS['confidence'].keys(config.criteria) == ('0.01', '0.03', '0.05')
    assert ANSWERS['confidence'].refining_key(config.criteria) == '0.01'
    assert ANSWERS['detection'].keys(SearchConfig(iou_threshold=0.7).criteria) == ('iou0.7',)
    assert ANSWERS['detection'].f_pred_scale(4) == 1 and ANSWERS['count'].f_pred_scale(4) == 4


def test_the_envelope_reads_detection_records_per_answer_and_per_class(searched, tmp_path):
    out, _ = searched
    records = read_jsonl(out / EVALUATIONS)
    classes = ThresholdDetector.classes
    for r in records:
        # An answer changes where one of its classes does: a lost, new or displaced object has one.
        assert violated(r, 'iou0.5') == any(violated(r, 'iou0.5', c) for c in classes), r['composition']
    # The boundary search refines by the IoU key, and its records give a bracket per direction.
    config = SearchConfig(algorithm='envelope', population=16, evaluations=160, seed=0)
    with ResultsStore(tmp_path / 'envelope') as store:
        run_search(_scene(), ThresholdDetector(), config, image_id='scene', store=store)
    found = {b.direction: b for b in boundaries(read_jsonl(tmp_path / 'envelope' / EVALUATIONS), 'iou0.5')}
    assert set(found) == {d.name for d in directions(config.space)}
    assert all(b.censored or b.clean < b.violating for b in found.values())


def test_each_violation_key_is_named_and_ordered_by_its_kind():
    from metavlm_ros.method.answers import key_label, key_order

    keys = ['iou0.7', '0.05', 'count', '0.01', 'iou0.5']
    assert sorted(keys, key=key_order) == ['count', '0.01', '0.05', 'iou0.5', 'iou0.7']
    assert [key_label(k, short=True) for k in ('count', '0.05', 'iou0.5')] == ['count', 'Th=5%', 'IoU=50%']
    assert key_label('iou0.5') == 'objects (lost, new, reclassed or IoU < 0.5)'
    assert key_label('0.03') == 'Th=0.03' and key_label('count') == 'count change'
    with pytest.raises(ParameterError, match='unknown violation key'):
        key_label('nonsense')


def test_render_draws_a_detection_evaluations_boxes_beside_its_follow_up(searched, tmp_path):
    import cv2

    from metavlm_ros.cli import main
    from metavlm_ros.viewer.boxes import ROLE_RGBA

    out, _ = searched
    records = read_jsonl(out / EVALUATIONS)
    broken = next(r for r in records if r['violation']['iou0.5'] and r['followup_detections'])
    argv = ['render', str(out), str(broken['index']), '--boxes', '--out', str(tmp_path / 'r')]
    assert main(argv) == 0
    plain, drawn = sorted((tmp_path / 'r').glob('*.png'), key=lambda p: p.name.endswith('_boxes.png'))
    assert drawn.name == plain.name.replace('.png', '_boxes.png')
    a, b = (cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in (plain, drawn))
    assert a.shape == b.shape and not np.array_equal(a, b)
    colours = {tuple(round(255 * c) for c in rgba[:3]) for rgba in ROLE_RGBA.values()}
    # Every found box's corner is drawn in a role's colour (the searched frame is the source size;
    # within 60 of it: the anti-aliased line blends with the frame).
    for d in broken['followup_detections']:
        x1, y1 = (round(v) for v in d['box'][:2])
        corner = b[y1, x1].astype(int)
        assert min(np.abs(corner - c).sum() for c in colours) <= 60 and (corner != a[y1, x1]).any(), d
    # A search of confidences has no boxes to draw: refused in one line, exit 2.
    from test.fakes import ImageStatsBackend

    with ResultsStore(tmp_path / 'confidences') as store:
        run_search(
            _scene(),
            ImageStatsBackend(),
            SearchConfig(population=4, evaluations=8),
            image_id='c',
            store=store,
        )
    assert main(['render', str(tmp_path / 'confidences'), '1', '--boxes', '--out', str(tmp_path / 'r2')]) == 2
    assert not (tmp_path / 'r2').exists()
