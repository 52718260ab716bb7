"""The tester's failure modes on /diagnostics (ros/tester_modes.py): the top modes of its results
directory, learnt again as searches end, bounded by a sample, and found on disk by a restarted tester."""

import math

from rclpy.parameter import Parameter

from metavlm_ros.explain.catalogue import CatalogueSettings
from metavlm_ros.explain.modes import catalogue_of
from metavlm_ros.ros.tester_modes import MODES_STATUS
from test.conftest import make_frame
from test.ros.tester_graph import values_of

#: A small budget, judged at the tester tests' report threshold (test/ros/tester_graph.py: 0.01).
PARAMETERS = {'modes_period_s': 0.2, 'algorithm': 'random', 'population': 12, 'evaluations': 60}


def _status(statuses) -> dict[str, str]:
    found = [s for s in statuses if s.name == MODES_STATUS]
    return values_of(found[0]) | {'message': found[0].message} if found else {}


def _now(g) -> dict[str, str]:
    """The modes' status as the next /diagnostics message carries it (without waiting for the timer)."""
    return _status(g.tester.modes_status.statuses())


def _published(g) -> dict[str, str]:
    """Wait until the modes are learnt from all the results hold; check them against `metavlm modes` on
    the directory: the same top modes, as it finds them."""
    expected = catalogue_of([g.results], CatalogueSettings(threshold=0.01))
    assert expected.modes, 'the stand-in model gave no failure mode to publish'
    learnt = str(expected.evaluations)
    g.wait(lambda: _now(g).get('learnt_from') == learnt, 10, f'modes of {learnt} evaluations')
    status = _now(g)
    assert status['modes'] == str(len(expected.modes))
    assert status['message'] == f'{len(expected.modes)} mode(s); 1. {expected.modes[0].rule}'
    for rank, mode in enumerate(expected.modes[:3], start=1):
        assert status[f'mode_{rank}'] == mode.rule
        assert status[f'mode_{rank}_change'] == mode.change.label
        assert int(status[f'mode_{rank}_violations']) == mode.violations_inside
        assert math.isclose(float(status[f'mode_{rank}_rate_inside']), mode.rate_inside, rel_tol=1e-5)
        assert math.isclose(float(status[f'mode_{rank}_rate_outside']), mode.rate_outside, rel_tol=1e-5)
        assert status[f'mode_{rank}_example'] == mode.example['render']
    return status


def test_the_top_modes_follow_the_results_within_a_sample_and_a_restart_finds_them(graph):
    g = graph(**{**PARAMETERS, 'modes_period_s': 0.0})
    assert not _now(g)  # off: no status
    changed = g.tester.set_parameters([Parameter('modes_period_s', value=0.2)])
    assert changed[0].successful
    assert _now(g)['message'] == 'none learnt yet' and _now(g)['evaluations_seen'] == '0'
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the first search')
    first = _published(g)
    assert first['evaluations_seen'] == '60' and float(first['learn_s']) > 0
    # On /diagnostics beside the tester's health, as the timer publishes it.
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'diagnostics after the modes')
    assert _status(g.diagnostics.messages[-1].status)['mode_1'] == first['mode_1']
    # Evidence grows: the modes are learnt again from both searches, in the learner's thread.
    g.camera.publish(make_frame(96, 72, seed=2))
    g.wait(lambda: g.tester.searches_done == 2, message='the second search')
    assert _published(g)['evaluations_seen'] == '120'
    # A smaller sample at run time: the directory read again, a uniform 100 of its evaluations kept.
    assert g.tester.set_parameters([Parameter('modes_sample', value=100)])[0].successful
    g.wait(lambda: _now(g).get('learnt_from') == '100', 10, 'modes of a sample of 100')
    assert (_now(g)['evaluations_seen'], _now(g)['evaluations_sampled']) == ('120', '100')
    g.close()
    # A restarted tester learns what its results directory already holds before any search.
    assert _published(graph(**PARAMETERS))['evaluations_seen'] == '120'
