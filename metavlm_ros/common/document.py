"""A report as a value: sections of text, tables, figures and lists, rendered to Markdown, HTML and CSV
by one renderer and written atomically."""

from __future__ import annotations

import csv
import html
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metavlm_ros.common.directories import write_file_atomic

__all__ = [
    'Block',
    'Bullets',
    'Code',
    'Document',
    'Figure',
    'Inline',
    'Link',
    'Paragraph',
    'Preformatted',
    'RENDERERS',
    'Section',
    'Strong',
    'Table',
    'format_value',
    'markdown_text',
    'plain',
    'render_csv',
    'render_html',
    'render_markdown',
    'slug',
    'write_csv',
    'write_document',
]


@dataclass(frozen=True)
class Code:
    """Literal text in a line: a path, a command, a label."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Text in bold: an outcome."""

    text: str


@dataclass(frozen=True)
class Link:
    """Text that links to `href` (a path relative to the document, or a URL)."""

    text: str
    href: str


#: A piece of a line: plain text (a newline in it breaks the line), or marked-up text.
Inline = str | Code | Strong | Link


@dataclass(frozen=True, init=False)
class Paragraph:
    """A paragraph: its pieces in order, `Paragraph('Base ', Code(path), ': the same frames')`."""

    parts: tuple[Inline, ...]

    def __init__(self, *parts: Inline) -> None:
        object.__setattr__(self, 'parts', parts)


@dataclass(frozen=True)
class Bullets:
    """A bulleted list; each item a line of plain text or a Paragraph."""

    items: Sequence[str | Paragraph]


@dataclass(frozen=True)
class Figure:
    """An image file (a path relative to the document) and its caption."""

    path: str
    caption: str


@dataclass(frozen=True)
class Preformatted:
    """Text shown exactly as it is (a JSON record); `language` names it for Markdown's fence."""

    text: str
    language: str = ''


@dataclass(kw_only=True)
class Table:
    """A table: raw values in rows (None for 'not applicable'), a format per column.

    A value is formatted by its column's format (`format_value`) in Markdown and HTML and written
    unrounded in CSV; a Code, Strong or Link value is shown marked up. `key` names the table's CSV file
    and anchor, `title` and `note` the section that shows it (`section`).
    """

    columns: list[str]
    rows: list[list[Any]]
    formats: list[str] = field(default_factory=list)
    key: str = ''
    title: str = ''
    note: str = ''

    def column(self, name: str) -> list[Any]:
        """The values of one column."""
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def row(self, **match: Any) -> list[Any]:
        """The first row whose named columns equal the given values (KeyError when none)."""
        indices = {self.columns.index(name): value for name, value in match.items()}
        for row in self.rows:
            if all(row[i] == v for i, v in indices.items()):
                return row
        raise KeyError(f'{self.key}: no row with {match}')

    def cell(self, column: str, **match: Any) -> Any:
        """One value: the named column of the first row matching `match`."""
        return self.row(**match)[self.columns.index(column)]

    def formatted(self) -> list[list[str]]:
        """Rows as display strings (marked-up values as their plain text)."""
        return [
            [plain(value, fmt) for value, fmt in zip(row, self._formats(), strict=True)] for row in self.rows
        ]

    def section(self) -> Section:
        """The table under its title, followed by its note; '(no rows)' instead of an empty table."""
        shown: list[Block] = [self if self.rows else Paragraph('(no rows)')]
        return Section(self.title, shown + ([Paragraph(self.note)] if self.note else []), anchor=self.key)

    def _formats(self) -> list[str]:
        return self.formats or [''] * len(self.columns)


@dataclass(frozen=True)
class Section:
    """A heading and what it holds; a Section inside a Section is one heading level down."""

    heading: str
    blocks: Sequence[Block]
    anchor: str = ''


Block = Paragraph | Bullets | Figure | Preformatted | Table | Section


@dataclass(frozen=True)
class Document:
    """A whole report: its title (the top heading) and its blocks.

    Attributes:
        title: The top heading.
        blocks: What the document holds, in order; Sections give the second-level headings.
        page_title: The HTML page's title, when it is not `title`.
        contents: Whether the HTML page lists its sections, linked, before the first one.
    """

    title: str
    blocks: Sequence[Block]
    page_title: str = ''
    contents: bool = False


def slug(text: str) -> str:
    """`text` as a key for a file name or an anchor: letters and digits, the rest '_', lower case."""
    return ''.join(c if c.isalnum() else '_' for c in text).strip('_').lower()


def format_value(value: Any, fmt: str = '') -> str:
    """A table value for display: '-' for None or NaN, 'p' a p-value, '%' a fraction as a percentage,
    any other `fmt` Python's format of a number."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    if fmt == 'p':
        return '<0.0001' if value < 1e-4 else f'{value:.4f}'
    if fmt == '%':
        return f'{100.0 * value:.1f}'
    if fmt and _is_number(value):
        return format(value, fmt)
    return str(value)


def plain(value: Any, fmt: str = '') -> str:
    """A value, marked up or not, as plain text."""
    if isinstance(value, (Code, Strong, Link)):
        return value.text
    if isinstance(value, Paragraph):
        return ''.join(plain(part) for part in value.parts)
    return format_value(value, fmt)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: How each kind of inline text is marked up, per format: a template of its escaped fields.
_INLINE = {
    'md': {Code: '`{text}`', Strong: '**{text}**', Link: '[{text}]({href})'},
    'html': {
        Code: '<code>{text}</code>',
        Strong: '<strong>{text}</strong>',
        Link: '<a href="{href}">{text}</a>',
    },
}


def _same(text: str) -> str:
    return text


def _inline(
    part: Inline | Paragraph, markup: str, field: Callable[[str], str], text: Callable[[str], str]
) -> str:
    """Inline text in a format: plain text through `text`, marked-up parts through `_INLINE`'s
    templates with their fields through `field`."""
    if isinstance(part, Paragraph):
        return ''.join(_inline(p, markup, field, text) for p in part.parts)
    if isinstance(part, str):
        return text(part)
    fields = {name: field(getattr(part, name)) for name in ('text', 'href') if hasattr(part, name)}
    return _INLINE[markup][type(part)].format(**fields)


# Markdown


def _md_inline(part: Inline | Paragraph) -> str:
    return _inline(part, 'md', _same, _same)


def _md_cell(value: Any, fmt: str) -> str:
    # A '|' inside a cell would end it.
    text = _md_inline(value) if isinstance(value, (Code, Strong, Link)) else format_value(value, fmt)
    return text.replace('|', '\\|')


def _md_row(cells: Sequence[str]) -> str:
    return '|' + ''.join(f' {cell} |' if cell else ' |' for cell in cells)


def _md_block(block: Block, level: int) -> str:
    if isinstance(block, Section):
        heading = f'{"#" * level} {block.heading}'
        return '\n\n'.join([heading, *(_md_block(b, level + 1) for b in block.blocks)])
    if isinstance(block, Paragraph):
        return _md_inline(block)
    if isinstance(block, Bullets):
        return '\n'.join(f'- {_md_inline(item)}' for item in block.items)
    if isinstance(block, Figure):
        return f'![{block.caption}]({block.path})'
    if isinstance(block, Preformatted):
        return f'```{block.language}\n{block.text}\n```'
    lines = [_md_row(block.columns), '|' + '---|' * len(block.columns)]
    formats = block._formats()
    lines += [_md_row([_md_cell(v, f) for v, f in zip(row, formats, strict=True)]) for row in block.rows]
    return '\n'.join(lines)


def markdown_text(blocks: Sequence[Block], level: int = 2) -> str:
    """Blocks as Markdown, a blank line between them; their Sections' headings at `level`."""
    return '\n\n'.join(_md_block(block, level) for block in blocks)


def render_markdown(document: Document) -> str:
    """The document as Markdown: its title a first-level heading, then its blocks."""
    return markdown_text([Section(document.title, document.blocks)], level=1) + '\n'


# HTML

_STYLE = (
    'body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:0.5em 0}'
    'td,th{border:1px solid #aaa;padding:0.2em 0.5em;text-align:left}th{background:#eee}'
    'td.n{text-align:right}'
    'img{max-width:48em;display:block;margin:1em 0}figcaption{color:#444;font-size:90%}'
    'pre{background:#f6f6f6;padding:0.5em}'
)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _html_inline(part: Inline | Paragraph) -> str:
    return _inline(part, 'html', _esc, lambda text: _esc(text).replace('\n', '<br>\n'))


def _html_cell(value: Any, fmt: str) -> str:
    if isinstance(value, (Code, Strong, Link)):
        return f'<td>{_html_inline(value)}</td>'
    # Numbers line up on the right.
    tag = '<td class="n">' if _is_number(value) else '<td>'
    return f'{tag}{_esc(format_value(value, fmt))}</td>'


def _anchor(section: Section) -> str:
    return section.anchor or slug(section.heading)


def _html_block(block: Block, level: int) -> str:
    if isinstance(block, Section):
        heading = f'<h{level} id="{_esc(_anchor(block))}">{_esc(block.heading)}</h{level}>'
        return '\n'.join([heading, *(_html_block(b, level + 1) for b in block.blocks)])
    if isinstance(block, Paragraph):
        return f'<p>{_html_inline(block)}</p>'
    if isinstance(block, Bullets):
        return '<ul>' + ''.join(f'<li>{_html_inline(item)}</li>' for item in block.items) + '</ul>'
    if isinstance(block, Figure):
        src, caption = _esc(block.path), _esc(block.caption)
        return f'<figure><img src="{src}" alt="{caption}"><figcaption>{caption}</figcaption></figure>'
    if isinstance(block, Preformatted):
        return f'<pre>{_esc(block.text)}</pre>'
    rows = ['<tr>' + ''.join(f'<th>{_esc(c)}</th>' for c in block.columns) + '</tr>']
    formats = block._formats()
    rows += [
        '<tr>' + ''.join(_html_cell(v, f) for v, f in zip(row, formats, strict=True)) + '</tr>'
        for row in block.rows
    ]
    return '<table>' + '\n'.join(rows) + '</table>'


def render_html(document: Document) -> str:
    """The document as a self-contained HTML page (figures linked as files beside it), all text escaped."""
    body = [f'<h1>{_esc(document.title)}</h1>']
    sections = [b for b in document.blocks if isinstance(b, Section)]
    for block in document.blocks:
        if document.contents and sections and block is sections[0]:
            links = ''.join(f'<li><a href="#{_esc(_anchor(s))}">{_esc(s.heading)}</a></li>' for s in sections)
            body.append(f'<h2>Contents</h2>\n<ul>{links}</ul>')
        body.append(_html_block(block, 2))
    title = _esc(document.page_title or document.title)
    head = f'<head><meta charset="utf-8"><title>{title}</title><style>{_STYLE}</style></head>'
    return '\n'.join(['<!DOCTYPE html>', f'<html lang="en">{head}<body>', *body, '</body></html>']) + '\n'


# CSV


def _csv_value(value: Any, fmt: str) -> Any:
    if isinstance(value, (Code, Strong, Link)):
        return value.text
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ''
    # A column labelled % holds percentages, unrounded (the tables keep fractions internally).
    return 100.0 * value if fmt == '%' else value


def render_csv(table: Table) -> str:
    """One table as CSV, unrounded (percentages in % columns); empty fields for 'not applicable'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator='\n')
    writer.writerow(table.columns)
    formats = table._formats()
    for row in table.rows:
        writer.writerow([_csv_value(v, fmt) for v, fmt in zip(row, formats, strict=True)])
    return buffer.getvalue()


# Writing

RENDERERS: dict[str, Callable[[Document], str]] = {'.md': render_markdown, '.html': render_html}


def write_document(document: Document, path: str | Path) -> Path:
    """Write the document atomically, as Markdown or HTML by the path's suffix (.md, .html).

    Raises:
        ValueError: Another suffix.
        OSError: The write failed; nothing is left under the path.
    """
    path = Path(path)
    if path.suffix not in RENDERERS:
        raise ValueError(f'{path}: a document is written as {" or ".join(RENDERERS)}')
    write_file_atomic(path, RENDERERS[path.suffix](document).encode('utf-8'))
    return path


def write_csv(table: Table, path: str | Path) -> Path:
    """Write one table as CSV, atomically."""
    path = Path(path)
    write_file_atomic(path, render_csv(table).encode('utf-8'))
    return path
