"""The CLI's tables: Rich tables whose cells and title are text as given, never Rich markup.

What goes into a table comes from indexes, registries and the matrix (``[mirrors]`` in a hint,
``extra[cuda]`` in a requirement); read as markup, Rich would drop it without a word."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text


def _literal(value: Any) -> Any:
    return Text(value) if isinstance(value, str) else value


class RichTable(Table):
    """``rich.table.Table`` with every string cell and the title taken literally."""

    def __init__(self, *headers: Any, title: Any = None, **kwargs: Any) -> None:
        super().__init__(*headers, title=_literal(title), **kwargs)

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*(_literal(cell) for cell in renderables), **kwargs)
