"""Verdicts as JUnit XML, the test report GitLab, Jenkins and GitHub actions show in a CI run."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from metavlm_ros.assurance.verdict import FAIL, INCONCLUSIVE, FailureModes, Verdict
from metavlm_ros.common.directories import write_file_atomic

__all__ = ['junit_xml', 'write_junit']

# XML 1.0 admits only these characters (Char production, §2.2): a model's answer or a file name in a
# reason can carry others (NUL, escape sequences, lone surrogates), which would make the report unreadable.
_NOT_XML = re.compile('[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]')

# Judging takes no time worth reporting and the CI job times the run; a fixed value keeps the report
# byte-identical for identical verdicts. Consumers (dorny/test-reporter) expect the attribute.
_TIME = '0'


def _clean(text: Any) -> str:
    return _NOT_XML.sub('', str(text))


def _jsonable(value: Any) -> Any:
    # numpy scalars and arrays (figures computed with numpy) have tolist(); anything else is shown as text.
    return value.tolist() if hasattr(value, 'tolist') else str(value)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, default=_jsonable)


def _testcase(parent: ET.Element, verdict: Verdict, modes: FailureModes | None) -> None:
    case = ET.SubElement(
        parent,
        'testcase',
        {'classname': _clean(f'metavlm.{verdict.kind}'), 'name': _clean(verdict.criterion), 'time': _TIME},
    )
    shown = {'claim': verdict.claim, 'figures': verdict.figures}
    if verdict.status == FAIL:
        failure = ET.SubElement(case, 'failure', {'message': _clean(verdict.reason), 'type': FAIL})
        shown['counterexample'] = verdict.counterexample
        if modes is not None and verdict.criterion in modes.lines:
            lines = list(modes.lines[verdict.criterion])
            shown['failure_modes'] = {'modes': lines, 'catalogue': str(modes.catalogue)}
        failure.text = _clean(_json(shown))
        return
    if verdict.status == INCONCLUSIVE:
        ET.SubElement(case, 'skipped', {'message': _clean(f'{INCONCLUSIVE}: {verdict.reason}')})
    out = ET.SubElement(case, 'system-out')
    out.text = _clean(f'{verdict.reason}\n{_json(shown)}')


def junit_xml(
    verdicts: list[Verdict], *, suite: str, properties: dict[str, str], modes: FailureModes | None = None
) -> bytes:
    """The verdicts as one JUnit XML test suite, one test case per criterion.

    PASS is a passed case (reason and figures in its system-out), FAIL a failure (type FAIL, the
    reason as message, claim, figures, counterexample and, with `modes`, `failure_modes` (the lines
    naming the modes that break it and the catalogue's path) as indented JSON), INCONCLUSIVE a skipped
    case (message 'INCONCLUSIVE: <reason>'): neither pass nor fail in a CI view, as `metavlm verify`'s
    exit status 3 says. Characters that XML 1.0 forbids are removed from every text.

    Args:
        verdicts: The criteria judged, in the order to list them.
        suite: The suite's name (the criteria file, say).
        properties: What the verdicts hold for (model identity, criteria sha256, tool version...),
            written as the suite's properties in this order.
        modes: The failure modes that break each failing criterion (None: none named).

    Returns:
        The UTF-8 document, with its XML declaration.
    """
    counts = {
        'tests': str(len(verdicts)),
        'failures': str(sum(v.status == FAIL for v in verdicts)),
        'errors': '0',
        'skipped': str(sum(v.status == INCONCLUSIVE for v in verdicts)),
        'time': _TIME,
    }
    root = ET.Element('testsuites', {'name': _clean(suite), **counts})
    testsuite = ET.SubElement(root, 'testsuite', {'name': _clean(suite), **counts})
    listed = ET.SubElement(testsuite, 'properties')
    for name, value in properties.items():
        ET.SubElement(listed, 'property', {'name': _clean(name), 'value': _clean(value)})
    for verdict in verdicts:
        _testcase(testsuite, verdict, modes)
    ET.indent(root)
    return ET.tostring(root, encoding='utf-8', xml_declaration=True) + b'\n'


def write_junit(
    path: str | Path,
    verdicts: list[Verdict],
    *,
    suite: str,
    properties: dict[str, str],
    modes: FailureModes | None = None,
) -> None:
    """Write `junit_xml` to `path` atomically: a reader (a CI upload) sees the old file or the new one whole.

    Raises:
        OSError: when the file cannot be written; nothing is left under a temporary name.
    """
    write_file_atomic(path, junit_xml(verdicts, suite=suite, properties=properties, modes=modes))
