"""Answer changes read from records of each kind of answer."""

from metavlm_ros.explain.changes import Change, answer_changes


def test_confidence_changes_by_the_threshold_either_way():
    record = {
        'kind': 'confidence',
        'source': {'trash': 0.6, 'animal': 0.3, 'object': 0.5},
        'followup': {'trash': 0.55, 'animal': 0.33, 'object': 0.52},
    }
    assert answer_changes(record, 0.05) == {Change('dropped', 'trash')}  # |d| >= Th, as Eq. 5
    assert answer_changes(record, 0.03) == {Change('dropped', 'trash'), Change('rose', 'animal')}


def test_count_changes_lost_gained_and_swapped():
    def changes(source, followup):
        return answer_changes({'kind': 'count', 'source': source, 'followup': followup}, 0.0)

    assert changes({'trash': 1, 'object': 0}, {'trash': 0, 'object': 0}) == {Change('lost', 'trash')}
    assert changes({'trash': 1, 'animal': 0}, {'trash': 1, 'animal': 2}) == {Change('gained', 'animal')}
    assert changes({'trash': 1, 'object': 0}, {'trash': 0, 'object': 1}) == {
        Change('swapped', 'trash', 'object')
    }
    assert changes({'trash': 1}, {'trash': 1}) == set()
    assert Change('swapped', 'trash', 'object').label == 'trash swapped for object'


def test_detection_changes_from_the_box_match():
    record = {
        'kind': 'detection',
        'boxes': {
            'expected': [{'class': 'trash'}, {'class': 'animal'}, {'class': 'object'}],
            'lost': [0],
            'new': [1],
            'reclassed': [[2, 0]],
            'displaced': [[1, 2, 0.3]],
            'matched': [],
        },
        'followup_detections': [{'class': 'vegetation'}, {'class': 'trash'}, {'class': 'animal'}],
    }
    assert answer_changes(record, 0.05) == {
        Change('lost', 'trash'),
        Change('new', 'trash'),
        Change('displaced', 'animal'),
        Change('swapped', 'object', 'vegetation'),
    }
