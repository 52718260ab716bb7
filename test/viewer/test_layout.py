"""The shipped Foxglove layout: current with its builder, and showing only topics the export writes."""

import json
from pathlib import Path

from metavlm_ros.viewer.channels import topic_names
from metavlm_ros.viewer.layout import LAYOUT_FILE, build_layout

SHIPPED = Path(__file__).resolve().parents[2] / 'config' / LAYOUT_FILE


def test_shipped_layout_is_the_builders():
    # Regenerate with: python -m metavlm_ros.viewer.layout > config/foxglove_layout.json
    assert SHIPPED.read_text(encoding='utf-8') == build_layout()


def strings(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def test_layout_shows_the_export_topics_in_the_panels_the_issue_asks_for():
    layout = json.loads(SHIPPED.read_text(encoding='utf-8'))
    shown = set(strings(layout))
    topics = topic_names()
    assert {topics['source'], topics['followup'], topics['annotations'], '/diagnostics'} <= shown
    assert {f'{topics["violations"]}.f_trans', f'{topics["violations"]}.f_pred'} <= shown
    assert {'Image', 'Plot', 'Table', 'DiagnosticsSummary'} <= shown
    assert (
        not {s for s in shown if s.startswith('/metavlm/')}
        - set(topics.values())
        - {
            f'{topics["violations"]}.f_trans',
            f'{topics["violations"]}.f_pred',
        }
    )
