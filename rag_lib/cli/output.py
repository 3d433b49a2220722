"""How `rag` prints: its console (`app.console`, `app.err_console`) and the cells its tables share.

In a terminal, output fits the terminal's width. Into a pipe or a file (`rag list | grep NVDA`,
`rag search ... > hits.txt`) nothing is wrapped: each table row is one line however long, as `kubectl
get` and `gh` print, unless COLUMNS names a width. `--json` is the format for programs."""

from __future__ import annotations

import copy
import re
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleDimensions, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

UNBOUNDED = 100_000  # the width of a pipe: wider than any row, and nothing pads lines to it


class CliConsole(Console):
    """A console whose width, when it does not write to a terminal, fits what it prints (COLUMNS
    when set). Rich would take the width of whichever standard stream is a terminal, or 80 without
    one, and fold every longer row of a table onto several lines."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._width = kwargs.get("width")  # rich fixed COLUMNS as it was at import; `size` reads it when printing
        self.push_render_hook(_TitlesLeftInPipes(self))

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size  # the terminal's, COLUMNS, or a width set in code
        if self.is_terminal or self._width is not None or self._environ.get("COLUMNS", "").isdigit():
            return size
        return ConsoleDimensions(UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


class _TitlesLeftInPipes(RenderHook):
    """Out of a terminal a table's title and caption are lines of their own at the left margin:
    centred over a row hundreds of characters long, they would start off the screen of `less`, and
    inside the table they were folded at its width ("ingest into 'tradegent' (264.8" / "s)")."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        if self.console.is_terminal:
            return renderables
        out: list[ConsoleRenderable] = []
        for r in renderables:
            out.extend(self._annotations_apart(r) if isinstance(r, Table) else [r])
        return out

    def _annotations_apart(self, table: Table) -> list[ConsoleRenderable]:
        """The title, the table without its title and caption, and the caption."""
        bare = copy.copy(table)  # the caller's table keeps its title
        bare.title = bare.caption = None
        title = [self._line(table.title, table.title_style or "table.title")] if table.title else []
        caption = [self._line(table.caption, table.caption_style or "table.caption")] if table.caption else []
        return [*title, bare, *caption]

    def _line(self, text: Any, style: Any) -> ConsoleRenderable:
        return self.console.render_str(text, style=style, highlight=False) if isinstance(text, str) else text


_PATH_PART = re.compile(r"#.*|[^/#]+/?|/")  # a folder with its slash, a file name, a '#section' anchor


class PathCell:
    """A path or unit id (`folder/file.yaml#section`) in a table cell: when the column is narrower
    than it, it breaks after a slash or before the '#' rather than mid-name; a part longer than the
    column is folded. Printed as it is (brackets are not read as markup)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.parts = _PATH_PART.findall(path)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        whole = cell_len(self.path)
        longest = max((cell_len(p) for p in self.parts), default=0)  # the narrowest it reads well
        return Measurement(longest, whole).clamp(max_width=options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        lines = [""]
        for part in self.parts:
            used = cell_len(lines[-1]) % width  # of the last row the cell shows (a long part is folded)
            if used and used + cell_len(part) > width >= cell_len(part):  # it fits on a row of its own
                lines.append("")
            lines[-1] += part
        yield Text("\n".join(lines), overflow="fold")

    def __str__(self) -> str:
        return self.path
