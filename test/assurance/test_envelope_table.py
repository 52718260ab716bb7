"""The verification report's envelope table in water (MR12): a row per Jerlov type the evidence was searched
in, its bounds the order statistics of that type's brackets alone (recomputed here with pandas from the
records), never one distribution pooled over waters."""

import json
import math

import pandas as pd
import pytest
import yaml
from scipy import stats

from metavlm_ros.assurance.criteria import load_criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.gather import gather, plan
from metavlm_ros.assurance.judge import envelope_table, judge
from metavlm_ros.assurance.report import write_report
from metavlm_ros.common.images import Frame
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.models.identity import answered_model_identity
from test.assurance.evidence import write_run
from test.conftest import make_frame
from test.fakes import ImageStatsBackend

EIGHT = tuple('abcdefgh')
CLAIM = {'id': 'two', 'kind': 'envelope', 'relation': 'water', 'within': {'water_type': ['III', '1C']},
         'at_least': 0.5, 'frames': 0.5}  # fmt: skip
III, C1 = 'water+ (Jerlov III, at the surface)', 'water+ (Jerlov 1C, at the surface)'


@pytest.fixture(scope='module')
def two_waters(tmp_path_factory):
    """An envelope claim in Jerlov III and 1C searched as `metavlm verify` does (a boundary search per
    type, `envelope-two-typeIII` and `envelope-two-type1C`), on 8 frames: the criteria and the evidence."""
    root = tmp_path_factory.mktemp('two-waters')
    path = root / 'criteria.yaml'
    path.write_text(yaml.safe_dump({'format': 1, 'name': 'two waters', 'criteria': [CLAIM]}))
    criteria = load_criteria(path)
    planned = plan(criteria, population=8, evaluations=40, seed=0, working_size=None, envelope_rounds=2)
    backend = ImageStatsBackend()
    model = answered_model_identity(backend.model_id, backend.classes, backend=backend.name)
    frames = [Frame(name, make_frame(64, 48, seed=i)) for i, name in enumerate(EIGHT)]
    gather(planned, frames, backend, model, root / 'evidence', log=lambda message: None)
    return criteria, root / 'evidence'


def _brackets(root) -> pd.DataFrame:
    """Per water type and frame, water+'s bracket from the records alone: the smallest violating range
    added (NaN: none broke), the largest clean one below it (0 when none)."""
    records = pd.concat(
        [pd.read_json(p, lines=True) for p in sorted(root.rglob('evaluations.jsonl*'))], ignore_index=True
    )
    alone = records[(records['order'] == 1) & ~records['failed'].astype(bool)]
    alone = alone[alone['parameters'].map(lambda p: next(iter(p)) == 'water')]
    tried = pd.DataFrame({
        'water_type': alone['parameters'].map(lambda p: p.get('water_type', 0.0)),
        'image': alone['image'],
        'magnitude': alone['parameters'].map(lambda p: p['water']),
        'violated': alone['violation'].map(lambda v: bool(v['0.05'])),
    })  # fmt: skip
    tried = tried[tried['magnitude'] > 0]
    where = ['water_type', 'image']
    violating = tried[tried['violated']].groupby(where)['magnitude'].min().rename('violating')
    tried = tried.join(violating, on=where)
    below = tried[~tried['violated'] & ~(tried['magnitude'] >= tried['violating'])]
    clean = below.groupby(where)['magnitude'].max().rename('clean')
    frames = tried.groupby(where).size().rename('tries').to_frame().join([violating, clean])
    return frames.fillna({'clean': 0.0}).reset_index()


def _median_bounds(brackets: pd.DataFrame, confidence: float) -> tuple[float | None, float | None]:
    """The median's bounds by order statistics (docs/assurance.md): the r-th smallest clean end, r the
    largest with P(Bin(n, .5) >= r) >= c; the s-th smallest violating end, s the smallest with
    P(Bin(n, .5) <= s - 1) >= c (a censored frame's end infinite)."""
    n = len(brackets)
    r = max((r for r in range(1, n + 1) if stats.binom.sf(r - 1, n, 0.5) >= confidence), default=None)
    s = min((s for s in range(1, n + 1) if stats.binom.cdf(s - 1, n, 0.5) >= confidence), default=None)
    cleans = sorted(brackets['clean'])
    ends = sorted(brackets['violating'].fillna(math.inf))
    lower = None if r is None else cleans[r - 1]
    upper = None if s is None or ends[s - 1] == math.inf else ends[s - 1]
    return lower, upper


def _check_row(row: dict, brackets: pd.DataFrame, confidence: float) -> None:
    assert row['frames'] == len(brackets) and row['censored'] == brackets['violating'].isna().sum()
    lower, upper = _median_bounds(brackets, confidence)
    assert row['median_lower'] == pytest.approx(lower) and row['median_upper'] == pytest.approx(upper)
    assert row['min_violating'] == pytest.approx(brackets['violating'].min())


def test_water_searched_in_two_types_gives_a_row_per_type_from_its_own_records(two_waters):
    criteria, root = two_waters
    table = envelope_table(load_evidence(root), '0.05', criteria.confidence)
    assert [row['row'] for row in table] == [III, C1]
    assert [row['direction'] for row in table] == ['water+', 'water+']
    assert [row['within']['water_type'] for row in table] == [[4.0, 4.0], [5.0, 5.0]]
    brackets = _brackets(root)
    assert sorted(brackets['water_type'].unique()) == [4.0, 5.0] and len(brackets) == 2 * len(EIGHT)
    for row in table:
        _check_row(
            row, brackets[brackets['water_type'] == row['within']['water_type'][0]], criteria.confidence
        )
    # The types' boundaries differ: one row pooled over both would stand for neither.
    medians = [(row['median_lower'], row['median_upper']) for row in table]
    assert medians[0] != medians[1]


def test_the_report_carries_the_rows_per_type(two_waters, tmp_path):
    criteria, root = two_waters
    evidence = load_evidence(root)
    write_report(tmp_path, criteria, evidence, judge(criteria, evidence), manifest='not checked')
    record = json.loads((tmp_path / 'verdict.json').read_text())
    assert [row['row'] for row in record['envelope']] == [III, C1]
    assert record['envelope'][0]['condition'] == 'Jerlov III, at the surface'
    assert all([row['row'] for row in rows] == [III, C1] for rows in record['envelope_by_class'].values())
    assert [row['row'] for row in record['envelope_by_threshold']['0.05']] == [III, C1]
    # The verdict's own figure per condition names the same waters as the table's rows.
    (verdict,) = record['verdicts']
    assert {f'water+ ({c})' for c in verdict['figures']['median_boundary_by_condition']} == {III, C1}
    markdown = (tmp_path / 'verdict.md').read_text()
    assert f'| {III} |' in markdown and f'| {C1} |' in markdown and '| water+ |' not in markdown
    assert (tmp_path / 'envelope.png').stat().st_size > 0


def test_water_searched_in_one_type_names_it(two_waters):
    criteria, root = two_waters
    (row,) = envelope_table(load_evidence(root / 'envelope-two-typeIII'), '0.05', criteria.confidence)
    assert row['row'] == III and row['condition'] == 'Jerlov III, at the surface'
    brackets = _brackets(root / 'envelope-two-typeIII')
    assert list(brackets['water_type'].unique()) == [4.0]
    _check_row(row, brackets, criteria.confidence)


def test_a_search_that_varied_the_water_is_one_row_of_its_region(tmp_path):
    # Uniform samples draw a type per evaluation: one row of the region searched, not a row per sample.
    space = SearchSpace.from_options(['water'], {'water_type': (4.0, 5.0), 'water_depth': (0.0, 0.0)})
    write_run(tmp_path / 'samples', 'uniform', space=space, evaluations=30)
    evidence = load_evidence(tmp_path / 'samples')
    types = {r['parameters']['water_type'] for _, r in evidence.evaluations() if r['order'] == 1}
    assert len(types) > 2
    (row,) = envelope_table(evidence, '0.05')
    assert row['row'] == 'water+ (Jerlov III to 1C, at the surface)'
    assert row['within']['water_type'] == [4.0, 5.0] and row['frames'] == 3


def test_compare_judges_the_water_boundary_per_type_too(two_waters):
    """`metavlm compare` pairs each frame's water+ boundary within one water type: an item per type, its
    medians that type's alone (recomputed from the records), never the waters pooled."""
    from metavlm_ros.assurance.compare import NO_CHANGE, compare

    _, root = two_waters
    evidence = load_evidence(root)
    changes, _ = compare(evidence, evidence)
    water = [c for c in changes if c.item.startswith('water+')]
    assert [c.item for c in water] == [f'{III} boundary', f'{C1} boundary']
    brackets = _brackets(root)
    for change, water_type in zip(water, (4.0, 5.0), strict=True):
        mine = brackets[brackets['water_type'] == water_type]
        points = mine['violating'].fillna(mine['clean'])  # a frame that held: its largest clean range
        assert change.figures['frames'] == len(mine) == 8
        assert change.figures['base_median'] == pytest.approx(float(points.median()))
        assert change.verdict == NO_CHANGE and change.p == 1.0
