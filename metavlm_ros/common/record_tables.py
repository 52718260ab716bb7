"""A results directory's records as tables for analysts: Parquet (nested fields kept) and CSV (flat)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

from metavlm_ros.common.directories import build_aside
from metavlm_ros.common.errors import InputError
from metavlm_ros.common.record_format import RECORD_FILES, VIOLATIONS, iter_jsonl, records_file
from metavlm_ros.common.upgrade import Upgrade

__all__ = ['TABLE_FORMATS', 'export_tables', 'flatten']

TABLE_FORMATS = ('parquet', 'csv')
_NAMES = (*RECORD_FILES, VIOLATIONS)


def flatten(record: dict, prefix: str = '') -> dict:
    """One CSV row: nested mappings as dotted columns (`followup.animal`, `violation.0.05`), lists as
    JSON text (`genotype`), everything else as it is."""
    row: dict = {}
    for key, value in record.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            row.update(flatten(value, name + '.'))
        elif isinstance(value, list):
            row[name] = json.dumps(value, separators=(',', ':'))
        else:
            row[name] = value
    return row


def _write_csv(source: Path, target: Path) -> int:
    # Two passes, so that a column only later records have (a parse error) is still a column.
    columns: dict[str, None] = {}
    count = 0
    for record in iter_jsonl(source, strict=True):
        columns.update(dict.fromkeys(flatten(record)))
        count += 1
    with open(target, 'x', newline='', encoding='utf-8') as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), restval='')
        writer.writeheader()
        for record in iter_jsonl(source, strict=True):
            writer.writerow(flatten(record))
    return count


def _write_parquet(source: Path, target: Path) -> int:
    import duckdb

    # Whole records (any layout ever written) as plain JSON Lines beside the target, for DuckDB to type
    # over every record (not a sample), then one Parquet file.
    lines = target.with_name(f'.{target.stem}.jsonl')
    count = 0
    with open(lines, 'x', encoding='utf-8') as handle:
        for record in iter_jsonl(source, strict=True):
            handle.write(json.dumps(record, separators=(',', ':')) + '\n')
            count += 1
    try:
        connection = duckdb.connect()
        try:
            connection.execute(
                f"COPY (SELECT * FROM read_json('{lines}', format = 'newline_delimited', "
                f"sample_size = -1)) TO '{target}' (FORMAT parquet)"
            )
        finally:
            connection.close()
    finally:
        lines.unlink()
    return count


def export_tables(
    directory: str | Path, out: str | Path, fmt: str, *, log: Callable[[str], None] | None = None
) -> Upgrade:
    """Write each record file of the results directory `directory` (any format) as a table in the new
    directory `out`: NAME.parquet or NAME.csv (evaluations, pareto, summary, violations); a file with
    no record gets none. `out` appears whole or not at all.

    Raises:
        InputError: `directory` holds no records; `out` exists; an unknown format.
        ResultsError: A record file is damaged before its last record.
        StorageError: `out` could not be written.
    """
    if fmt not in TABLE_FORMATS:
        raise InputError(f'--format {fmt}: expected one of {", ".join(TABLE_FORMATS)}')
    directory, out = Path(directory), Path(out)
    present = [name for name in _NAMES if records_file(directory / name).is_file()]
    if not present:
        raise InputError(f'{directory}: not a results directory (none of {", ".join(_NAMES)})')
    write = _write_parquet if fmt == 'parquet' else _write_csv
    log = log or (lambda message: None)

    def fill(staged: Path) -> Upgrade:
        done = Upgrade()
        for name in present:
            target = staged / f'{name.removesuffix(".jsonl")}.{fmt}'
            if not any(True for _ in iter_jsonl(directory / name)):
                log(f'{records_file(directory / name)}: no record, no table')
                continue
            done.records[target.name] = write(directory / name, target)
        return done

    return build_aside(out, fill, outside=directory)
