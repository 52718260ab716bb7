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
        rows = duckdb.sql(f"SELECT * FROM read_json('{path}')")
        found = [dict(zip(rows.columns, row, strict=True)) for row in rows.fetchall()]
        assert len(found) == len(ours), name
        for theirs, record in zip(found, ours, strict=True):
            for key in ('index', 'genotype', 'f_pred', 'f_trans', 'followup', 'violation', 'image', 'seed'):
                if key in record:
                    assert theirs[key] == record[key], (name, key)
