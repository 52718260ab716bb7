"""Check an exported MCAP against the results directory it came from, independently of the exporter.

What is expected is read from the directory with `read_jsonl`; follow-ups whose PNG was not kept are
made by `metavlm render` (the reference, byte for byte), not by the exporter's own code path.
"""

from pathlib import Path

import cv2
import numpy as np

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl, record_key, records_file, search_key, source_digest
from metavlm_ros.method.search import followup_name
from test.viewer.mcap_decode import read_mcap


def expected_violations(results: Path) -> list[dict]:
    """The tester's published violations, else every evaluation violating by any criterion."""
    if records_file(results / 'violations.jsonl').is_file():
        return read_jsonl(results / 'violations.jsonl')
    return [
        r
        for r in read_jsonl(results / 'evaluations.jsonl')
        if not r.get('failed') and r['order'] and any(r['violation'].values())
    ]


def expected_changed(record: dict) -> list[str]:
    # Eq. 4 (counts differ by >= 1) or Eq. 5 at the smallest violated threshold.
    limit = 1.0 if record['kind'] == 'count' else min(float(t) for t, v in record['violation'].items() if v)
    return [c for c in record['source'] if abs(record['followup'][c] - record['source'][c]) >= limit]


def _loose(key: tuple) -> tuple:
    return (*key[:3], None, key[4])


def reference_followups(results: Path, violations: list[dict], scratch: Path) -> dict[tuple, bytes]:
    """Record key -> the follow-up PNG a violation must show: the kept PNG, else `metavlm render`'s."""
    kept = {record_key(r): r['frame'] for r in read_jsonl(results / 'pareto.jsonl') if r.get('frame')}
    kept.update({record_key(r): r['frame'] for r in violations if r.get('frame')})
    summaries = {search_key(s): s for s in read_jsonl(results / 'summary.jsonl')}
    summaries.update({_loose(k): s for k, s in list(summaries.items())})
    wanted: dict[tuple, list[dict]] = {}
    for record in violations:
        if record_key(record) not in kept:
            summary = summaries.get(search_key(record)) or summaries[_loose(search_key(record))]
            wanted.setdefault(search_key(summary), []).append(record)
    found = {key: (results / frame).read_bytes() for key, frame in kept.items()}
    for number, records in enumerate(wanted.values()):
        first = records[0]
        out = scratch / f'render-{number}'
        pick = ['--image', first['image'], '--algorithm', first['algorithm'], '--seed', str(first['seed'])]
        if first.get('run') is not None:
            pick += ['--run', str(first['run'])]
        indices = [str(r['index']) for r in records]
        assert main(['render', str(results), *indices, *pick, '--out', str(out)]) == 0
        for r in records:
            name = followup_name(r['image'], r['algorithm'], r['seed'], r['index'])
            found[record_key(r)] = (out / f'{name}.png').read_bytes()
    return found


def check_export(results: Path, out: Path, scratch: Path, prefix: str = '/metavlm', bag_frames=None) -> dict:
    """Assert every violation of `results` is in `out` at its time, with its follow-up and overlay.

    Returns the decoded MCAP for further checks.
    """
    data = read_mcap(out)
    topics = data['topics']
    violations = expected_violations(results)
    assert violations, f'{results}: the tiny model should have violated somewhere'
    searches: list[tuple] = []
    for record in [*read_jsonl(results / 'evaluations.jsonl'), *violations]:
        if search_key(record) not in searches:
            searches.append(search_key(record))

    def time_of(record):
        stamp = record.get('source_stamp') or record.get('stamp_ns')
        if not stamp and str(record.get('frame_file', '')).endswith(('.mp4', '.mkv', '.avi', '.mov')):
            return int(record['stamp_ns'])  # a video's first frame, at 0
        return int(stamp) if stamp else (searches.index(search_key(record)) + 1) * 10**9

    logged = {record_key(m): (t, m) for t, m, _ in topics[f'{prefix}/violations']}
    assert len(topics[f'{prefix}/violations']) == len(violations) == len(logged)
    for record in violations:
        time, message = logged[record_key(record)]
        assert time == time_of(record) == message['stamp_ns']
        assert message['f_trans'] == record['f_trans'] and message['f_pred'] == record['f_pred']
        assert message['changed'] == expected_changed(record)

    # Every violation's follow-up, kept or not, with its overlay, at its source frame's time. Images
    # and overlays are written in the same order, so the i-th of each belong together.
    references = reference_followups(results, violations, scratch)
    images = topics[f'{prefix}/followup/image']
    notes = topics[f'{prefix}/followup/annotations']
    assert len(images) == len(notes) == len(violations)
    by_name = {(r['image'], r['algorithm'], r['seed'], r.get('run'), r['index']): r for r in violations}
    seen = set()
    for (time, image, _), (note_time, note, _) in zip(images, notes, strict=True):
        lines = [t.text for t in note.texts]
        record = next(
            r
            for key, r in by_name.items()
            if lines[0].startswith(f'evaluation {key[4]} of {key[0]} ({key[1]}, seed {key[2]}')
        )
        seen.add(record_key(record))
        assert time == note_time == time_of(record)
        assert image.timestamp.seconds * 10**9 + image.timestamp.nanos == time
        assert image.format == 'png' and image.data == references[record_key(record)]
        text = '\n'.join(lines)
        assert f'composition {record["composition"]}' in text
        assert f'f_trans {record["f_trans"]:.4f}' in text and f'f_pred {record["f_pred"]:.4f}' in text
        assert all(f'{name}={value:.4g}' in text for name, value in record['parameters'].items())
        assert all(f'{c} ' in text for c in expected_changed(record))
    assert len(seen) == len(violations)

    # The source frame of every search: the bag's pixels, else the stored one (its sha256 checked).
    sources = {t: m for t, m, _ in topics[f'{prefix}/source/image']}
    summaries = read_jsonl(results / 'summary.jsonl')
    assert {time_of(r) for r in [*violations, *summaries]} <= set(sources)
    for summary in summaries:
        bgr = cv2.imdecode(np.frombuffer(sources[time_of(summary)].data, np.uint8), cv2.IMREAD_COLOR)
        rgb = np.ascontiguousarray(bgr[..., ::-1])
        if bag_frames is None:
            assert source_digest(rgb) == summary['source_sha256']
        else:
            assert np.array_equal(rgb, bag_frames[time_of(summary)])
    return data
