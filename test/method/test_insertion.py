"""Object insertion (docs/method.md §13): the pasted object, and the oracle of each kind of answer.

The detector doubles are box_scene.py's perfect detector on the follow-up: each source object's true
box (its mask moved by the warp, less what the pasted object hides) and the pasted object's, found
where the follow-up differs from the same composition without insertion. Variants miss the pasted
object or lose a source object far from it; count doubles count those boxes.
"""

from dataclasses import replace

import numpy as np
import pytest

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import EVALUATIONS, ResultsStore, read_jsonl
from metavlm_ros.method.answers import ANSWERS, Thresholds
from metavlm_ros.method.boxes import Detection, compare_detections, expected_boxes
from metavlm_ros.method.encoding import Composition, SearchSpace
from metavlm_ros.method.envelope import violated
from metavlm_ros.method.insertion import MIN_EXPECTED_AREA, insert_object, pasted_object
from metavlm_ros.method.insertion_oracle import expected_with_insertion, inserted_in
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.prediction import CLASSES, Prediction
from metavlm_ros.method.relations import RELATION_BY_ID, RELATION_GROUPS, apply_composition, apply_relation
from metavlm_ros.method.render import find_search, render_search
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.viewer.boxes import violation_outlines
from test.fakes import ThresholdDetector
from test.method.box_scene import HEIGHT, WIDTH, scene_frame, true_boxes

SIZE = (WIDTH, HEIGHT)
# Where the tests paste (area, class, x, y): clear of every object; over the small trash (a crate
# that hides it: no longer expected); over part of the large object; beside it, after a rotation.
CLEAR = {'insertion': 0.03, 'insertion_class': 3.0, 'insertion_x': 0.9, 'insertion_y': 0.1}
HIDING = {'insertion': 0.03, 'insertion_class': 2.0, 'insertion_x': 0.249, 'insertion_y': 0.84}
PARTLY = {'insertion': 0.03, 'insertion_class': 0.0, 'insertion_x': 0.75, 'insertion_y': 0.75}
TURNED = {'rotation': 3.0, 'insertion': 0.05, 'insertion_class': 1.0, 'insertion_x': 0.5, 'insertion_y': 0.5}
PLACES = {'clear': CLEAR, 'hiding': HIDING, 'partly': PARTLY, 'turned': TURNED}


def _prediction(detections, kind: str = 'detection') -> Prediction:
    counts = {c: float(sum(d.cls == c for d in detections)) for c in CLASSES}
    return Prediction(kind, counts, detections=tuple(detections) if kind == 'detection' else ())


@pytest.fixture(scope='module')
def frame():
    return scene_frame()


@pytest.fixture(scope='module')
def source(frame):
    return _prediction(true_boxes(Composition.identity()))


def _answers(frame, parameters: dict) -> tuple[Composition, list[Detection], Detection]:
    """A composition, the source objects' true boxes in its follow-up, and the pasted object's box."""
    composition = Composition.from_parameters(parameters)
    followup = apply_composition(frame, composition)
    rest = {k: v for k, v in parameters.items() if not k.startswith('insertion')}
    plain = apply_composition(frame, Composition.from_parameters(rest)) if rest else frame
    pasted = np.abs(followup.astype(int) - plain.astype(int)).max(axis=2) > 8
    ys, xs = np.nonzero(pasted)
    box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
    cls = CLASSES[int(parameters['insertion_class'])]
    return composition, true_boxes(composition, hidden=pasted), Detection(cls, 1.0, box)


@pytest.fixture(scope='module')
def answered(frame):
    return {name: _answers(frame, parameters) for name, parameters in PLACES.items()}


def _judge(source, found, composition, strict=False, kind='detection'):
    criteria = Thresholds((0.01, 0.05), 0.5, strict)
    return ANSWERS[kind].judge(source, _prediction(found, kind), criteria, composition, SIZE)


@pytest.mark.parametrize('place', PLACES)
def test_the_true_boxes_and_the_pasted_object_give_no_violation_strict_or_not(source, answered, place):
    composition, boxes, pasted = answered[place]
    for strict in (False, True):
        judged = _judge(source, [*boxes, pasted], composition, strict)
        assert not any(judged.violation.values()) and judged.f_pred < 0.05, (place, strict, judged.boxes)
        # The pasted object is expected last, with no source object; required only when strict.
        last = judged.boxes['expected'][-1]
        assert (last['class'], last['source'], last['required']) == (pasted.cls, None, strict)


def test_a_source_object_the_pasted_one_hides_is_no_longer_expected(source, answered):
    composition, boxes, pasted = answered['hiding']
    assert len(boxes) == 4  # the small trash is gone from view
    judged = _judge(source, [*boxes, pasted], composition)
    assert [e['required'] for e in judged.boxes['expected']] == [True, True, True, True, False, False]


def test_a_source_object_partly_covered_may_be_found_whole_or_by_its_part_in_view():
    # A bottle pasted over the right half of an object's box, across its whole height.
    bottle = pasted_object(0.06, 3.0, 0.763, 0.722, *SIZE)
    x1, y1, x2, y2 = bottle.box
    box = (x1 - 40.0, y1 + 8.0, x1 + 40.0, y2 - 8.0)
    (plain,) = expected_boxes([Detection('object', 1.0, box)], None, *SIZE)
    covered, pasted = expected_with_insertion([plain], bottle, find_inserted=False)
    assert covered.required and covered.inner[2] < plain.inner[2] and pasted.source is None
    in_view = Detection('object', 1.0, (box[0], box[1], x1 + 2.0, box[3]))
    for found in (in_view, Detection('object', 1.0, box)):
        assert not compare_detections([covered], [found], iou_threshold=0.9).violation
    # Without the pasted object the part in view is a displaced box at that IoU threshold.
    assert compare_detections([plain], [in_view], iou_threshold=0.9).displaced


def test_missing_the_pasted_object_is_caught_only_under_the_strict_option(source, answered):
    composition, boxes, _ = answered['clear']
    assert not _judge(source, boxes, composition).violation['iou0.5']
    strict = _judge(source, boxes, composition, strict=True)
    assert strict.violation['iou0.5'] and strict.boxes['lost'] == [len(boxes)]  # the pasted one
    assert strict.f_pred == pytest.approx(1 - 5 / 5.5)
    # An object too small to expect is not required even then.
    small = {**CLEAR, 'insertion': MIN_EXPECTED_AREA / 2}
    composition, boxes, _ = _answers(scene_frame(), small)
    assert not _judge(source, boxes, composition, strict=True).violation['iou0.5']


def test_losing_a_source_object_away_from_the_pasted_one_is_caught(source, answered):
    composition, boxes, pasted = answered['partly']
    kept = [b for b in boxes if b.cls != 'animal']  # the animal is far from the pasted fish
    for strict in (False, True):
        judged = _judge(source, [*kept, pasted], composition, strict)
        assert judged.violation['iou0.5'] and judged.boxes['lost'] == [1] and not judged.boxes['new']


def test_a_count_must_rise_by_one_of_the_pasted_class(source, answered):
    counts = replace(source, kind='count', detections=())
    composition, boxes, pasted = answered['clear']
    judged = _judge(counts, [*boxes, pasted], composition, kind='count')
    assert judged.f_pred == 0.0 and not judged.violation['count'] and judged.strength['count'] is None
    unchanged = _judge(counts, boxes, composition, kind='count')  # the trash count did not rise
    assert unchanged.violation['count'] and unchanged.f_pred == 0.5 and unchanged.strength['count'] == 1.0
    twice = _judge(counts, [*boxes, pasted, pasted], composition, kind='count')
    assert twice.violation['count']
    # Too small to expect: counted or not, no violation; counted twice, one.
    composition = Composition.from_parameters({**CLEAR, 'insertion': MIN_EXPECTED_AREA / 2})
    assert not _judge(counts, boxes, composition, kind='count').violation['count']
    assert not _judge(counts, [*boxes, pasted], composition, kind='count').violation['count']
    assert _judge(counts, [*boxes, pasted, pasted], composition, kind='count').violation['count']
    # The envelope reads a class's own violation from a record by the same rule.
    record = {
        'kind': 'count',
        'source': counts.values,
        'followup': {**counts.values, 'trash': counts.values['trash'] + 1},
        'inserted': {'class': 'trash', 'box': list(pasted.box), 'expected': True},
    }
    assert not violated(record, 'count', 'trash') and not violated(record, 'count', 'animal')
    assert violated({**record, 'followup': counts.values}, 'count', 'trash')


def test_the_pasted_class_confidence_must_not_fall_and_the_others_are_not_judged():
    composition = Composition.from_parameters(CLEAR)  # pastes trash
    source = Prediction('confidence', {'animal': 0.5, 'vegetation': 0.5, 'object': 0.5, 'trash': 0.5})

    def judge(**followup):
        values = {**source.values, **followup}
        return ANSWERS['confidence'].judge(
            source, Prediction('confidence', values), Thresholds((0.01, 0.05)), composition, SIZE
        )

    rose = judge(trash=0.9, animal=0.1)
    assert rose.f_pred == 0.0 and not any(rose.violation.values())
    fell = judge(trash=0.47)
    assert fell.violation == {'0.01': True, '0.05': False} and fell.f_pred == pytest.approx(0.03)
    assert fell.strength == {'0.01': pytest.approx(0.03), '0.05': None}


def test_insertion_at_its_nominal_value_is_the_identity(frame, source, answered):
    assert RELATION_BY_ID['insertion'].is_identity(0.0)
    assert np.array_equal(apply_relation(frame, 'insertion', 0.0, 1.0, 0.2, 0.7), frame)
    nominal = Composition.from_parameters({'insertion': 0.0, 'insertion_class': 0.0})
    assert inserted_in(nominal, *SIZE) is None and f_trans(nominal) == 0.0
    assert np.array_equal(apply_composition(frame, nominal), frame)
    judged = _judge(source, list(source.detections), nominal, strict=True)
    assert judged.f_pred == 0.0 and len(judged.boxes['expected']) == len(source.detections)


def test_the_pasted_object_grows_with_the_value_inside_the_frame_and_renders_the_same_every_time(frame):
    shares = [pasted_object(a, 3.0, 1.0, 1.0, *SIZE).area for a in (0.01, 0.04, 0.1)]
    assert shares == sorted(shares) and shares == pytest.approx([0.01, 0.04, 0.1], rel=0.1)
    corner = pasted_object(0.1, 1.0, 1.0, 1.0, *SIZE).box
    assert corner[2] <= WIDTH and corner[3] <= HEIGHT and corner[2] > WIDTH - 3 and corner[3] > HEIGHT - 3
    once = insert_object(frame, 0.04, 'vegetation', 0.3, 0.4)
    pasted_object.cache_clear()
    assert np.array_equal(insert_object(frame, 0.04, 1.0, 0.3, 0.4), once)
    # Only pixels around the pasted box change; its class costs nothing in f_trans, its area does.
    x1, y1, x2, y2 = pasted_object(0.04, 1.0, 0.3, 0.4, *SIZE).box
    changed = np.nonzero((once != frame).any(axis=2))
    assert changed[0].min() >= y1 - 6 and changed[0].max() < y2 + 6 and changed[1].min() >= x1 - 6
    cost = f_trans(Composition.from_parameters({'insertion': 0.05, 'insertion_class': 0.0}))
    assert cost == pytest.approx(0.5) == f_trans(Composition.from_parameters({'insertion': 0.05}))
    assert Composition.from_parameters({'insertion': 0.05, 'insertion_class': 1.4}).extras[-1][0] == 1.0
    with pytest.raises(ParameterError, match="unknown pasted class 'whale'"):
        insert_object(frame, 0.04, 'whale')
    with pytest.raises(ParameterError, match='outside the allowed range'):
        apply_relation(frame, 'insertion', 0.2)


def test_insertion_is_opt_in_and_named_on_its_own():
    assert 'insertion' not in RELATION_GROUPS['all'] and SearchSpace.default().n_var == 12
    assert SearchSpace.from_options(['paper', 'insertion']).n_var == 12 + 2 + 3
    assert 'find_inserted' not in SearchConfig().identity()
    assert SearchConfig(find_inserted=True).identity()['find_inserted'] is True


def test_a_search_records_the_pasted_object_and_render_makes_its_follow_up_again(tmp_path):
    frame = np.full((90, 120, 3), (15, 50, 70), np.uint8)
    frame[20:45, 15:40] = (230, 40, 40)  # one bright trash object for the stand-in detector
    space = SearchSpace.from_options(['translation', 'insertion'])
    config = SearchConfig(algorithm='random', population=6, evaluations=12, seed=4, space=space)
    out = tmp_path / 'search'
    with ResultsStore(out) as store:
        run_search(frame, ThresholdDetector(), config, image_id='f', store=store)
    records = [r for r in read_jsonl(out / EVALUATIONS) if 'insertion' in r['parameters']]
    assert records and all(
        r['inserted']['class'] == CLASSES[int(r['parameters']['insertion_class'])] for r in records
    )
    rendered = render_search(out, find_search(out), [r['index'] for r in records[:3]])
    for record in records[:3]:
        composition = Composition.from_parameters(record['parameters'])
        assert np.array_equal(rendered[record['index']], apply_composition(frame, composition))
        inserted = inserted_in(composition, 120, 90)
        wanted = {'class': inserted.cls, 'box': list(inserted.box), 'expected': inserted.expected}
        assert record['inserted'] == wanted
        pasted = record['boxes']['expected'][-1]
        assert pasted['source'] is None and pasted['class'] == record['inserted']['class']
        labels = [o.label for o in violation_outlines(record['boxes'], record['followup_detections'])]
        assert f'pasted {pasted["class"]}' in ' '.join(labels)
    without = [r for r in read_jsonl(out / EVALUATIONS) if 'insertion' not in r['parameters']]
    assert all('inserted' not in r for r in without)


def test_a_model_without_the_pasted_class_is_named_before_the_search():
    space = SearchSpace.from_options(['insertion'], ranges={'insertion_class': (2.0, 3.0)})
    config = SearchConfig(algorithm='random', population=2, evaluations=2, space=space)
    backend = ThresholdDetector()
    backend.classes = ('animal', 'object')
    (answer,) = backend.predict([scene_frame()])
    source = replace(answer, values={'animal': 0.0, 'object': 0.0})
    with pytest.raises(ParameterError, match='insertion pastes trash, which the model does not answer'):
        run_search(scene_frame(), backend, config, source=source)
