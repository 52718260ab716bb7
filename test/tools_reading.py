"""Results read with pandas and DuckDB, as users read them, compared with the project's reader."""

from __future__ import annotations

from pathlib import Path

from metavlm_ros.common.results import EVALUATIONS, PARETO, SUMMARY, read_jsonl, records_file


def same_as_ours(directory: Path, names: tuple[str, ...] = (EVALUATIONS, PARETO, SUMMARY)) -> None:
    """pandas and DuckDB read each record file `names` of `directory` as the project's reader does."""
    import duckdb
    import pandas

    for name in names:
        path = records_file(directory / name)
        assert path.name == name + '.gz'
        ours = read_jsonl(directory / name)
        assert ours, name
        frame = pandas.read_json(path, lines=True, precise_float=True)
        assert len(frame) == len(ours), name
        for column in ('index', 'f_pred', 'f_trans', 'composition', 'hypervolume', 'image'):
            if column in frame:
                assert frame[column].tolist() == [r[column] for r in ours], (name, column)
        duckdb_rows_match(duckdb.sql(f"SELECT * FROM read_json('{path}')"), ours, name)


def duckdb_rows_match(rows, ours: list[dict], name: str) -> None:
    """A DuckDB relation holds the records `ours`, row for row, in the fields that say what was judged."""
    found = [dict(zip(rows.columns, row, strict=True)) for row in rows.fetchall()]
    assert len(found) == len(ours), name
    for theirs, record in zip(found, ours, strict=True):
        for key in ('index', 'genotype', 'f_pred', 'f_trans', 'followup', 'violation', 'image', 'seed'):
            if key in record:
                assert theirs[key] == record[key], (name, key)


def as_jq_reads(value):
    """`value` as jq 1.6 (Debian 12's) holds it: numbers are doubles, so an integer past 2**53 (a
    nanosecond stamp) is rounded to the nearest double (docs/results.md); jq 1.7 keeps it as written,
    which compares equal through this too."""
    if isinstance(value, dict):
        return {key: as_jq_reads(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_jq_reads(item) for item in value]
    if type(value) is int and abs(value) > 2**53:
        return float(value)
    return value


def jq_records(path: Path, program: str = '.') -> list[dict]:
    """What `zcat PATH | jq -c PROGRAM` prints, one JSON object a line (the shell as users run it),
    through `as_jq_reads`."""
    import json
    import subprocess

    done = subprocess.run(
        ['bash', '-c', f'zcat "{path}" | jq -c \'{program}\''], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [as_jq_reads(json.loads(line)) for line in done.stdout.splitlines()]
