"""The records' layout on disk (docs/results.md): every field read back, whole records in format 3, every
format written so far read, format 2's lines that refer to evaluations (written where an earlier version's
directory is appended to), and damage named."""

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.record_writers import WRITERS
from metavlm_ros.common.results import (
    EVALUATIONS,
    PARETO,
    SUMMARY,
    VIOLATIONS,
    ResultsStore,
    iter_jsonl,
    read_jsonl,
    records_file,
    to_jsonable,
)
from metavlm_ros.method.search import SearchConfig, evaluation_record, run_search
from test.conftest import make_frame
from test.fakes import BlackCountBackend, ImageStatsBackend

ROOT = Path(__file__).resolve().parents[2]
FILES = (EVALUATIONS, PARETO, SUMMARY)


class _Recording:
    """A store that keeps, per file, every record it is handed (as JSON values), as the tester writes."""

    def __init__(self, store: ResultsStore) -> None:
        self._store = store
        self.handed: dict[str, list[dict]] = {name: [] for name in (*FILES, VIOLATIONS)}

    def _keep(self, name, record):
        self.handed[name].append(json.loads(json.dumps(to_jsonable(record))))

    def append_evaluation(self, record):
        self._store.append_evaluation(record)
        self._keep(EVALUATIONS, record)

    def append_pareto(self, record):
        self._store.append_pareto(record)
        self._keep(PARETO, record)

    def append_summary(self, record):
        self._store.append_summary(record)
        self._keep(SUMMARY, record)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _legacy(directory: Path) -> Path:
    """A directory as an earlier version left it (an evaluations.jsonl): a store appends format 2 there."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / EVALUATIONS).touch()
    return directory


def _tester_like(directory, backend, frames=('a', 'b'), pngs=2) -> dict[str, list[dict]]:
    """Searches written as the tester writes them: every violation (by any criterion) to
    violations.jsonl with its PNG path, the first `pngs` of each search with a PNG."""
    config = SearchConfig(population=6, evaluations=40, seed=5, pareto_pngs=2)
    with ResultsStore(directory) as store:
        recording = _Recording(store)
        for i, name in enumerate(frames):
            extra = {'model': backend.model_id, 'source_stamp': 1000 + i, 'endpoint': 'inprocess'}
            written = []

            def on_evaluation(ev, result, extra=extra, written=written):
                if ev.failed or not any(ev.violation.values()):
                    return
                frame = f'frames/{result.image}_violation_e{ev.index:05d}.png'
                written.append(ev.index)
                frame = frame if len(written) <= pngs else None
                record = {**evaluation_record(ev, result, extra), 'frame': frame}
                store.append_violation(record)
                recording._keep(VIOLATIONS, record)

            run_search(make_frame(64, 48, seed=i), backend, config, image_id=name, store=recording,
                       on_evaluation=on_evaluation, extra_fields=extra)  # fmt: skip
    return recording.handed


class _Float32Stats(ImageStatsBackend):
    """A confidence model that computes in float32, as CLIP does (and fails every 7th answer)."""

    def predict(self, frames):
        return [
            p and dataclasses.replace(p, values={k: float(np.float32(v)) for k, v in p.values.items()})
            for p in super().predict(frames)
        ]


# A float32 confidence model, one whose values are float64, and a count model that answers in text.
_BACKENDS = {
    'float32': lambda: _Float32Stats(fail_every=7),
    'float64': lambda: ImageStatsBackend(fail_every=7),
    'count': BlackCountBackend,
}


@pytest.mark.parametrize('kind', list(_BACKENDS))
def test_every_record_is_a_whole_line_in_format_3(tmp_path, kind):
    handed = _tester_like(tmp_path / 'd', _BACKENDS[kind]())
    for name, records in handed.items():
        assert records, name
        path = records_file(tmp_path / 'd' / name)
        assert path.name == name + '.gz'
        with gzip.open(path, 'rt') as handle:  # the lines as any gzip reader sees them: the records
            assert [json.loads(line) for line in handle] == records, name
        assert list(iter_jsonl(tmp_path / 'd' / name, strict=True)) == records, name


@pytest.mark.parametrize('kind', list(_BACKENDS))
def test_every_field_reads_back_and_pareto_and_violations_refer_to_evaluations_in_format_2(tmp_path, kind):
    backend = _BACKENDS[kind]()
    handed = _tester_like(_legacy(tmp_path / 'd'), backend)
    for name, records in handed.items():
        assert records, name
        assert read_jsonl(tmp_path / 'd' / name) == records, name
        assert list(iter_jsonl(tmp_path / 'd' / name, strict=True)) == records, name
    evaluations = handed[EVALUATIONS]
    # Values that differ from the usual ones are there (so kept on their lines), and the usual ones too.
    assert any(r['cached'] for r in evaluations) and any(not r['cached'] for r in evaluations)
    assert any(r['followup_text'] for r in evaluations) == (backend.kind == 'count')
    assert any(r['failed'] for r in evaluations) == (kind != 'count')
    assert any(r['frame'] for r in handed[VIOLATIONS]) and any(r['frame'] is None for r in handed[VIOLATIONS])
    # On disk: a Pareto or violation line holds the evaluation's index and what it adds, no more.
    for name, added in ((PARETO, {'index', 'rank', 'frame'}), (VIOLATIONS, {'index', 'frame'})):
        lines = [json.loads(line) for line in (tmp_path / 'd' / name).read_text().splitlines()]
        headers = [line for line in lines if 'header' in line]
        assert headers and all(h['format'] == 2 and 'evaluations_at' in h for h in headers)
        assert all(line.keys() <= added for line in lines if 'header' not in line), name
    # An evaluation line leaves out its search's fields and the usual values: for each criterion, no
    # violation and no strength; a float32 model's follow-up values are written in their short form.
    lines = [json.loads(line) for line in (tmp_path / 'd' / EVALUATIONS).read_text().splitlines()]
    own = [line for line in lines if 'header' not in line]
    assert all(line.get('cached') is not False and 'image' not in line for line in own)
    assert all(False not in line.get('violation', {}).values() for line in own)
    assert all(None not in line.get('strength', {}).values() for line in own)
    assert any('violation' not in line for line in own) and any('violation' in line for line in own)
    float32 = [line for line in lines if 'followup' in line.get('float32', [])]
    assert bool(float32) == (kind == 'float32') and len(lines) - len(own) == 2  # a header a search
    if float32:
        handed_values = [v for r in evaluations if r['followup'] for v in r['followup'].values()]
        stored = [v for line in own if line.get('followup') for v in line['followup'].values()]
        assert len(json.dumps(stored)) < len(json.dumps(handed_values)) * 0.75


def test_records_of_every_format_written_read_the_same(tmp_path):
    # Whole records (before header lines), header lines (format 1), this store's (format 2): one reader.
    handed = _tester_like(tmp_path / 'new', BlackCountBackend())
    shared = ('image', 'algorithm', 'seed', 'model', 'working_size', 'kind', 'source', 'source_text',
              'source_stamp', 'endpoint')  # fmt: skip
    for name, records in handed.items():
        whole, headed, last = [], [], None
        for record in records:
            whole.append(json.dumps(record) + '\n')
            header = {k: record[k] for k in shared if k in record}
            if header != last and name != SUMMARY:
                headed.append(json.dumps({'header': header}) + '\n')
                last = header
            own = record if name == SUMMARY else {k: v for k, v in record.items() if k not in header}
            headed.append(json.dumps(own) + '\n')
        for layout, lines in (('whole', whole), ('headed', headed)):
            (tmp_path / layout).mkdir(exist_ok=True)
            (tmp_path / layout / name).write_text(''.join(lines))
    for layout in ('whole', 'headed', 'new'):
        for name, records in handed.items():
            assert read_jsonl(tmp_path / layout / name) == records, (layout, name)


def test_a_store_appends_in_its_format_to_results_of_an_older_one(tmp_path):
    # The committed fixture is in the header-line format (format 1); a store reopening such a
    # directory appends format 2 lines after it, and both read whole.
    fixture = ROOT / 'test' / 'fixtures' / 'seeded_search'
    directory = tmp_path / 'd'
    directory.mkdir()
    old = {}
    for name in FILES:
        shutil.copy(fixture / name, directory / name)
        old[name] = read_jsonl(directory / name)
    assert old[PARETO] and all('genotype' in r and 'rank' in r for r in old[PARETO])
    handed = _tester_like(directory, ImageStatsBackend())
    for name in FILES:
        assert read_jsonl(directory / name) == old[name] + handed[name], name


def test_a_store_picks_the_writer_of_its_format_once_by_the_directory_it_opens(tmp_path):
    # A new or replaced directory gets format 3 (NAME.gz); an earlier version's, format 2 lines (NAME).
    record = {'image': 'a', 'seed': 1, 'index': 0}
    for directory, overwrite, expected in (
        (tmp_path / 'new', False, 3),
        (_legacy(tmp_path / 'older'), False, 2),
        (_legacy(tmp_path / 'replaced'), True, 3),
    ):
        with ResultsStore(directory, overwrite=overwrite) as store:
            assert store.format == expected and WRITERS[expected].FORMAT == expected
            store.append_evaluation(record)
        assert records_file(directory / EVALUATIONS).name == EVALUATIONS + ('.gz' if expected == 3 else '')
        assert read_jsonl(directory / EVALUATIONS) == [record], directory.name


def test_a_pareto_or_violation_record_unlike_its_evaluation_is_written_whole(tmp_path):
    evaluation = {'image': 'a', 'seed': 1, 'index': 0, 'f_pred': 0.5, 'cached': 0, 'failed': None, 'text': ''}
    with ResultsStore(_legacy(tmp_path / 'd')) as store:
        store.append_evaluation(evaluation)
        store.append_evaluation({**evaluation, 'index': 1})
        store.append_evaluation({**evaluation, 'index': 1, 'f_pred': 0.7})  # index 1 twice: ambiguous
        store.append_pareto({**evaluation, 'f_pred': 0.6, 'rank': 0, 'frame': None})  # another value
        store.append_pareto({**evaluation, 'index': 1, 'rank': 1, 'frame': ''})
        store.append_pareto({**evaluation, 'rank': 2, 'frame': 'frames/x.png'})  # refers to index 0
        store.append_violation({**evaluation, 'index': 2, 'frame': None})  # no such evaluation
    assert read_jsonl(tmp_path / 'd' / EVALUATIONS) == [
        evaluation, {**evaluation, 'index': 1}, {**evaluation, 'index': 1, 'f_pred': 0.7}
    ]  # fmt: skip
    assert read_jsonl(tmp_path / 'd' / PARETO) == [
        {**evaluation, 'f_pred': 0.6, 'rank': 0, 'frame': None},
        {**evaluation, 'index': 1, 'rank': 1, 'frame': ''},
        {**evaluation, 'rank': 2, 'frame': 'frames/x.png'},
    ]
    assert read_jsonl(tmp_path / 'd' / VIOLATIONS) == [{**evaluation, 'index': 2, 'frame': None}]
    # 0, None and '' are no defaults' values: only False and '' are (of their own types).
    assert all(type(r['cached']) is int for r in read_jsonl(tmp_path / 'd' / PARETO))
    referring = [json.loads(x) for x in (tmp_path / 'd' / PARETO).read_text().splitlines()]
    assert referring[-1] == {'index': 0, 'rank': 2, 'frame': 'frames/x.png'}


def _damaged(evaluations: bytes, target: int) -> dict[str, bytes | None]:
    """evaluations.jsonl damaged in every way that loses evaluation `target` (a line number) or its search."""
    lines = evaluations.splitlines(keepends=True)
    return {
        'missing': None,
        'garbled': b''.join([*lines[:target], lines[target][:9] + b'\x00\n', *lines[target + 1 :]]),
        'line-removed': b''.join(lines[:target] + lines[target + 1 :]),
        'cut-short': b''.join(lines[:target]),
        'bytes-added-before': b'{"image": "x", "index": 0}\n' + evaluations,
        'another-search': evaluations.replace(b'"image":"a"', b'"image":"b"', 1),
    }


@pytest.mark.parametrize('name', [PARETO, VIOLATIONS])
def test_damaged_evaluations_that_lines_refer_to_are_named_by_every_reader(tmp_path, name):
    _tester_like(_legacy(tmp_path / 'd'), ImageStatsBackend(), frames=('a',))
    evaluations = (tmp_path / 'd' / EVALUATIONS).read_bytes()
    lines = [json.loads(x) for x in evaluations.splitlines()]
    referred = [json.loads(x) for x in (tmp_path / 'd' / name).read_text().splitlines()]
    referred = {x['index'] for x in referred if 'header' not in x}
    target = next(i for i, x in enumerate(lines) if 'header' not in x and x['index'] in referred)
    for what, data in _damaged(evaluations, target).items():
        directory = tmp_path / what
        shutil.copytree(tmp_path / 'd', directory)
        if data is None:
            (directory / EVALUATIONS).unlink()
        else:
            (directory / EVALUATIONS).write_bytes(data)
        with pytest.raises(ResultsError, match=f'{name}: line [0-9]+ refers to'):
            read_jsonl(directory / name)
        with pytest.raises(ResultsError, match=f'{name}: line [0-9]+ refers to'):
            list(iter_jsonl(directory / name, strict=True))
        if name == PARETO:  # a resume reads pareto.jsonl whole (strict) before it writes anything
            with pytest.raises(ResultsError, match='refers to|is damaged'):
                ResultsStore(directory, resume=True)


def test_results_of_a_newer_format_are_refused_not_misread(tmp_path):
    path = tmp_path / EVALUATIONS
    path.write_text('{"header": {"image": "a"}, "format": 3}\n{"index": 0}\n')
    with pytest.raises(ResultsError, match='line 1 is in results format 3, newer than this metavlm reads'):
        read_jsonl(path)
    path.write_text('{"header": {"image": "a"}, "format": "2"}\n{"index": 0}\n')
    with pytest.raises(ResultsError, match='line 1 is a damaged header line'):
        read_jsonl(path)


def test_float32_values_and_per_criterion_defaults_read_back_exactly(tmp_path):
    # Float32 values over their whole range, in their short form; a record that does not fit the
    # header in effect (a float64 value, other criteria) gets a new one, and the next ones keep it.
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(2000), 10.0 ** rng.uniform(-44, 38, 2000)])
    values = values.astype(np.float32)
    values *= rng.choice([-1, 1], values.size).astype(np.float32)
    handed = []
    with ResultsStore(_legacy(tmp_path / 'd')) as store:
        for i, chunk in enumerate(values.reshape(-1, 4)):
            record = {
                'image': 'a',
                'index': i,
                'followup': {c: float(v) for c, v in zip('abcd', chunk, strict=True)},
                'violation': {'0.01': bool(i % 2), '0.03': False},
                'strength': {'0.01': 0.5 if i % 2 else None, '0.03': None},
            }
            if i == 500:
                record['followup']['a'] = 0.1  # float64
            if i == 800:
                record['violation'] = {'count': True}
            store.append_evaluation(record)
            handed.append(record)
    assert read_jsonl(tmp_path / 'd' / EVALUATIONS) == handed
    lines = [json.loads(x) for x in (tmp_path / 'd' / EVALUATIONS).read_text().splitlines()]
    headers = [('float32' in x, list(x['defaults']['violation'])) for x in lines if 'header' in x]
    assert headers == [(True, ['0.01', '0.03']), (False, ['0.01', '0.03']), (True, ['count']),
                       (True, ['0.01', '0.03'])]  # fmt: skip


def test_a_served_models_latency_and_unparsed_answers_stay_on_their_lines(tmp_path):
    # Fields only some evaluations have, or that differ for each: one header line a search all the same.
    handed = [{'image': 'a', 'index': i, 'request': {'latency_s': i / 10, 'retries': 0}} for i in range(5)]
    handed[3]['parse_error'] = 'not the asked object'
    with ResultsStore(_legacy(tmp_path / 'd')) as store:
        for record in handed:
            store.append_evaluation(record)
    assert read_jsonl(tmp_path / 'd' / EVALUATIONS) == handed
    assert (tmp_path / 'd' / EVALUATIONS).read_text().count('"header"') == 1
