"""Tests of the JUnit XML report of verdicts, read back with junitparser as CI tools read it."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from junitparser import Failure, JUnitXml, Skipped

from metavlm_ros.assurance.junit import junit_xml, write_junit
from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, PASS, FailureModes, Verdict

PROPERTIES = {
    'model': 'openai/clip-vit-base-patch32',
    'criteria_sha256': 'ab' * 32,
    'metavlm_version': '1.4.0',
}


def _verdicts() -> list[Verdict]:
    return [
        Verdict(
            criterion='no-flip-small-rotation',
            kind='existence',
            status=FAIL,
            claim='no violation within rotation 2 degrees',
            reason='a violation at f_trans 0.2 (rotation 1.0 degree) within a budget of 3000 evaluations',
            figures={'budget': np.int64(3000), 'f_trans': np.float64(0.2)},
            counterexample={'image': 'frame_0007.png', 'index': 412, 'composition': '{1}'},
        ),
        Verdict(
            criterion='violation-rate',
            kind='rate',
            status=INCONCLUSIVE,
            claim='violation rate <= 1 % at 95 %',
            reason='upper bound 1.3 % over 230 samples',
            figures={'violations': 0, 'samples': 230, 'upper': 0.013},
        ),
        Verdict(
            criterion='rotation-envelope',
            kind='envelope',
            status=PASS,
            claim='rotation boundary >= 1 degree on 95 % of frames',
            reason='lower bound 1.4 degrees from 120 frames',
            figures={'lower': 1.4, 'n': 120, 'censored': 30},
        ),
    ]


def _read(data: bytes) -> JUnitXml:
    return JUnitXml.fromstring(data)


def test_counts_and_properties():
    report = _read(junit_xml(_verdicts(), suite='criteria.yaml', properties=PROPERTIES))
    (suite,) = list(report)
    assert suite.name == 'criteria.yaml'
    for element in (report, suite):
        assert (element.tests, element.failures, element.errors, element.skipped) == (3, 1, 0, 1)
    assert [(p.name, p.value) for p in suite.properties()] == list(PROPERTIES.items())
    assert [(case.classname, case.name) for case in suite] == [
        ('metavlm.existence', 'no-flip-small-rotation'),
        ('metavlm.rate', 'violation-rate'),
        ('metavlm.envelope', 'rotation-envelope'),
    ]


def test_each_status_is_its_junit_result():
    failed, inconclusive, passed = list(_read(junit_xml(_verdicts(), suite='s', properties={})))[0]

    (failure,) = failed.result
    assert isinstance(failure, Failure)
    assert failure.type == 'FAIL'
    assert failure.message == _verdicts()[0].reason
    shown = json.loads(failure.text)
    assert shown['figures'] == {'budget': 3000, 'f_trans': 0.2}
    assert shown['counterexample'] == {'image': 'frame_0007.png', 'index': 412, 'composition': '{1}'}
    assert '\n  "figures"' in failure.text  # indented for a person reading the CI page

    (skipped,) = inconclusive.result
    assert isinstance(skipped, Skipped)
    assert inconclusive.is_skipped and not inconclusive.is_passed
    assert skipped.message == 'INCONCLUSIVE: upper bound 1.3 % over 230 samples'

    assert passed.is_passed and passed.result == []
    reason, _, figures = passed.system_out.partition('\n')
    assert reason == 'lower bound 1.4 degrees from 120 frames'
    assert json.loads(figures)['figures'] == {'lower': 1.4, 'n': 120, 'censored': 30}


def test_a_failure_names_the_failure_modes_that_break_it():
    lines = (
        '2. rotation above 1.2 deg: fish dropped (7 of its 9 violations; ...)',
        '1. ... (2 of its 9 ...)',
    )
    modes = FailureModes({'no-flip-small-rotation': lines}, Path('verdict/modes/modes.md'))
    (suite,) = list(_read(junit_xml(_verdicts(), suite='s', properties={}, modes=modes)))
    failed, inconclusive, passed = suite
    assert json.loads(failed.result[0].text)['failure_modes'] == {
        'modes': list(lines),
        'catalogue': 'verdict/modes/modes.md',
    }
    assert 'failure_modes' not in inconclusive.system_out + passed.system_out
    # Without modes the failure is as before.
    (plain,) = list(_read(junit_xml(_verdicts()[:1], suite='s', properties={})))[0]
    assert 'failure_modes' not in json.loads(plain.result[0].text)


def test_text_is_escaped_and_stripped_of_characters_xml_forbids():
    reason = 'count <2> & "fish" \'crab\'\x01\x1b[0m\ud800 done'
    verdict = Verdict('a<b&"c"\x00', 'rate', FAIL, 'claim', reason, {'answer': 'Animals: 2\x07'})
    data = junit_xml([verdict], suite='s\x0b', properties={'model': 'm<&>"\x02'})
    (case,) = list(_read(data))[0]
    (failure,) = case.result
    assert failure.message == 'count <2> & "fish" \'crab\'[0m done'
    assert case.name == 'a<b&"c"'
    # JSON writes a control character as an escape, so the figure survives whole.
    assert '\\u0007' in failure.text
    assert json.loads(failure.text)['figures'] == {'answer': 'Animals: 2\x07'}
    assert [(p.name, p.value) for p in list(_read(data))[0].properties()] == [('model', 'm<&>"')]
    assert b'&lt;2&gt; &amp; &quot;fish&quot;' in data


def test_no_verdicts_is_an_empty_suite():
    report = _read(junit_xml([], suite='s', properties={}))
    (suite,) = list(report)
    assert (suite.tests, suite.failures, suite.skipped) == (0, 0, 0)
    assert list(suite) == []


def test_write_replaces_a_file_whole(tmp_path):
    path = tmp_path / 'junit.xml'
    path.write_bytes(b'x' * 100_000)
    write_junit(path, _verdicts(), suite='s', properties=PROPERTIES)
    assert path.read_bytes() == junit_xml(_verdicts(), suite='s', properties=PROPERTIES)
    assert os.listdir(tmp_path) == ['junit.xml']
    assert JUnitXml.fromfile(str(path)).tests == 3


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / 'junit.xml'
    path.write_bytes(b'old report')

    def refuse(src, dst):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'replace', refuse)
    with pytest.raises(OSError, match='No space'):
        write_junit(str(path), _verdicts(), suite='s', properties={})
    assert path.read_bytes() == b'old report'
    assert os.listdir(tmp_path) == ['junit.xml']
