"""What a violation's channels say (viewer/channels.py): the classes that changed, the overlay's lines."""

from metavlm_ros.viewer.channels import changed_classes, overlay_lines, topic_names

CONFIDENCE = {
    'kind': 'confidence',
    'index': 17,
    'image': 'dive@5',
    'algorithm': 'nsga2',
    'seed': 3,
    'composition': '{1,6}',
    'order': 2,
    'parameters': {'rotation': 2.5, 'translation': -0.03},
    'f_trans': 0.5 + 1.0,
    'f_pred': 0.07,
    'source': {'animal': 0.30, 'vegetation': 0.20, 'object': 0.10},
    'followup': {'animal': 0.26, 'vegetation': 0.215, 'object': 0.10},
    'violation': {'0.01': True, '0.03': True, '0.05': False},
}


def test_a_confidence_violation_names_the_classes_that_moved_by_its_smallest_threshold():
    # Eq. 5 at 0.01, the smallest threshold it violates: animal moved 0.04, vegetation 0.015.
    assert changed_classes(CONFIDENCE) == ['animal', 'vegetation']
    at_3 = {**CONFIDENCE, 'violation': {'0.01': False, '0.03': True, '0.05': False}}
    assert changed_classes(at_3) == ['animal']
    assert changed_classes({**CONFIDENCE, 'violation': dict.fromkeys(CONFIDENCE['violation'], False)}) == []


def test_a_count_violation_names_the_classes_whose_count_changed():
    # Eq. 4: a count that differs by at least one.
    record = {'kind': 'count', 'source': {'animal': 2, 'trash': 0}, 'followup': {'animal': 0, 'trash': 0}}
    assert changed_classes(record) == ['animal']


def test_the_overlay_says_what_renders_the_follow_up_again_and_what_changed():
    lines = overlay_lines({**CONFIDENCE, 'run': 4})
    assert lines == [
        'evaluation 17 of dive@5 (nsga2, seed 3, run 4)',
        'composition {1,6} (order 2): rotation=2.5, translation=-0.03',
        'f_trans 1.5000  f_pred 0.0700',
        'changed: animal 0.3->0.26, vegetation 0.2->0.215',
    ]
    assert overlay_lines(CONFIDENCE)[0] == 'evaluation 17 of dive@5 (nsga2, seed 3)'


def test_topics_sit_under_the_prefix():
    names = topic_names('/robot/metavlm/')
    assert names and all(topic.startswith('/robot/metavlm/') for topic in names.values())
    assert topic_names() == {key: topic.replace('/robot/metavlm', '/metavlm') for key, topic in names.items()}
