"""A campaign of a detection model: searched, and the paper's tables reported on boxes (IoU criterion)."""

import re

import yaml

from metavlm_ros.cli import main
from metavlm_ros.common.results import EVALUATIONS, read_jsonl
from metavlm_ros.models.tiny_detectors import build_tiny_detector


def test_a_detection_campaign_reports_the_papers_tables_at_the_iou_criterion(tmp_path):
    build_tiny_detector(tmp_path / 'owl', 'owlv2')
    assert (
        main(
            [
                'scenes',
                '--out',
                str(tmp_path / 'pngs'),
                '--format',
                'png',
                '--frames',
                '2',
                '--size',
                '160x120',
            ]
        )
        == 0
    )
    config = {
        'frames': {'sources': [str(tmp_path / 'pngs')]},
        'models': [{'backend': 'detector', 'model': str(tmp_path / 'owl'), 'name': 'owl', 'device': 'cpu'}],
        'runs': 2,
        'population': 6,
        'evaluations': 24,
        'seed': 5,
    }
    (tmp_path / 'c.yaml').write_text(yaml.safe_dump(config))
    assert main(['campaign', str(tmp_path / 'c.yaml'), '--out', str(tmp_path / 'out')]) == 0
    assert main(['report', str(tmp_path / 'out')]) == 0
    text = (tmp_path / 'out' / 'report' / 'report.md').read_text()
    assert (
        'owl (detection type)' in text
        and '## RQ3 (Table 7): violation strength by order, owl, IoU=50%' in text
    )
    # RQ2.2's count of violations is the records': every judged evaluation of order 1-6 of the cells.
    records = [
        r
        for cell in sorted((tmp_path / 'out' / 'cells').iterdir())
        if cell.is_dir() and not cell.name.startswith('.')
        for r in read_jsonl(cell / EVALUATIONS)
        if r['algorithm'] == 'nsga2' and r['order'] and not r['failed']
    ]
    (said,) = re.findall(
        r'(\d+) violations among (\d+) solutions of order 1-6', text.split('MetaVLM, IoU=50%')[1]
    )[:1]
    assert (int(said[0]), int(said[1])) == (sum(r['violation']['iou0.5'] for r in records), len(records))
