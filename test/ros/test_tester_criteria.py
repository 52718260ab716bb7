"""The tester's acceptance criteria on /diagnostics (ros/tester_criteria.py): each criterion's status,
OK / WARN / ERROR for PASS / INCONCLUSIVE / FAIL with its figures, current after each search and
judged from the results already on disk at configure."""

import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticStatus

from metavlm_ros.assurance.criteria import load_criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.judge import judge
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.ros.tester_node import TesterNode as MetaVLMTester  # not 'Test*': pytest would collect it
from test.conftest import make_frame
from test.ros.helpers import ros_context
from test.ros.tester_graph import StatsBackend, params, values_of

CRITERIA = {
    'format': 1,
    'name': 'tester test',
    'threshold': 0.01,
    'criteria': [
        {'id': 'anything', 'kind': 'existence', 'f_trans_max': 6},
        {'id': 'murky', 'kind': 'existence', 'within': {'turbidity': [0, 1]}},
        {'id': 'roll-rate', 'kind': 'rate', 'within': {'rotation': [-1, 1]}, 'limit': 0.1},
    ],
}


@pytest.fixture
def criteria_file(tmp_path):
    path = tmp_path / 'criteria.yaml'
    path.write_text(yaml.safe_dump(CRITERIA))
    return path


def _criteria_statuses(g) -> dict[str, DiagnosticStatus]:
    latest = g.diagnostics.messages[-1]
    return {
        s.name.rsplit(' ', 1)[-1]: s for s in latest.status if s.name.startswith('metavlm_tester: criterion')
    }


def test_each_criterion_has_a_status_kept_current_after_each_search(graph, criteria_file):
    g = graph(criteria_file=str(criteria_file))
    g.wait(lambda: g.diagnostics.messages, 5, 'diagnostics before any search')
    before = _criteria_statuses(g)
    assert list(before) == ['anything', 'murky', 'roll-rate']
    assert {s.level for s in before.values()} == {DiagnosticStatus.WARN}  # nothing searched yet
    g.camera.publish(make_frame(96, 72, seed=1))
    g.wait(lambda: g.tester.searches_done == 1, message='the search')
    count = len(g.diagnostics.messages)
    g.wait(lambda: len(g.diagnostics.messages) > count, 3, 'diagnostics after the search')
    after = _criteria_statuses(g)
    # The same verdicts `metavlm verify --results` gives on the tester's results directory.
    verdicts = {v.criterion: v for v in judge(load_criteria(criteria_file), load_evidence(g.results))}
    levels = {
        'PASS': DiagnosticStatus.OK,
        'INCONCLUSIVE': DiagnosticStatus.WARN,
        'FAIL': DiagnosticStatus.ERROR,
    }
    for name, status in after.items():
        verdict = verdicts[name]
        assert status.level == levels[verdict.status], name
        assert status.message == f'{verdict.status}: {verdict.claim}'
        kv = values_of(status)
        assert kv['status'] == verdict.status and kv['reason'] == verdict.reason
    assert verdicts['anything'].status == 'FAIL'  # the stand-in model breaks at 0.01
    assert values_of(after['anything'])['violations'] == str(verdicts['anything'].figures['violations'])
    assert verdicts['murky'].status == 'INCONCLUSIVE' and verdicts['roll-rate'].status == 'INCONCLUSIVE'


def test_a_restarted_tester_judges_the_results_already_on_disk(graph, criteria_file):
    first = graph(criteria_file=str(criteria_file))
    first.camera.publish(make_frame(96, 72, seed=1))
    first.wait(lambda: first.tester.searches_done == 1, message='the search')
    first.close()
    again = graph(criteria_file=str(criteria_file))
    again.wait(lambda: again.diagnostics.messages, 5, 'diagnostics')
    assert _criteria_statuses(again)['anything'].level == DiagnosticStatus.ERROR  # before any new search


@pytest.mark.parametrize(
    ('document', 'words'),
    [
        (
            {**CRITERIA, 'threshold': 0.02},
            'judges at threshold 0.02, not one of the thresholds 0.01, 0.03, 0.05',
        ),
        (
            {**CRITERIA, 'criteria': [{'id': 'x', 'kind': 'rate', 'within': {'rotation': [-1, 1]}}]},
            'limit: missing',
        ),
    ],
)
def test_a_bad_criteria_file_is_a_parameter_error_naming_it(tmp_path, document, words):
    path = tmp_path / 'criteria.yaml'
    path.write_text(yaml.safe_dump(document))
    with ros_context() as context:
        with pytest.raises(ParameterError, match='criteria_file: ') as caught:
            MetaVLMTester(
                context=context, backend=StatsBackend(), parameter_overrides=params(criteria_file=str(path))
            )
    assert words in str(caught.value)
