"""`gpuslice top`'s interactive view: Textual tables that refresh, with keys to sort and filter.

Keys: ``s`` next sort (card, user, idle, size), ``/`` filter (Enter applies, Escape clears),
``r`` refresh now, ``q`` quit. The snapshot comes from ``read`` (hub/top_source.py), called
off the UI thread every ``interval_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Input, Static

from hub.top import COLUMNS, SORTS, Snapshot, line_cells, rows, summary, table_cells


class TopApp(App[None]):
    TITLE = "gpuslice top"
    CSS = """
    #summary { height: auto; padding: 0 1; }
    #slices { height: 2fr; }
    #line { height: 1fr; }
    #alerts { height: auto; padding: 0 1; }
    #filter { dock: bottom; display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "next_sort", "sort"),
        Binding("slash", "filter", "filter"),
        Binding("r", "refresh", "refresh"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, read: Callable[[], Snapshot], interval_s: float = 2.0) -> None:
        super().__init__()
        self.read = read
        self.interval_s = interval_s
        self.sort = SORTS[0]
        self.filter_text = ""
        self.snapshot = Snapshot()

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("reading the hub...", id="summary")
        yield DataTable(id="slices", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="line", cursor_type="row")
        yield Static("", id="alerts")
        yield Input(placeholder="filter: a user, a server, a card or a model (Enter; Escape clears)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#slices", DataTable).add_columns(*COLUMNS)
        self.query_one("#line", DataTable).add_columns("#", "user", "server", "asks for", "waiting", "expected")
        self.action_refresh()
        self.set_interval(self.interval_s, self.action_refresh)

    @work(thread=True, exclusive=True)
    def action_refresh(self) -> None:
        snapshot = self.read()
        self.call_from_thread(self.show, snapshot)

    def show(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.redraw()

    def redraw(self) -> None:
        snapshot = self.snapshot
        how = f"sorted by {self.sort}" + (f", filtered by '{self.filter_text}'" if self.filter_text else "")
        self.query_one("#summary", Static).update(f"{summary(snapshot)}   [{how}]")
        slices = self.query_one("#slices", DataTable)
        slices.clear()
        for row in rows(snapshot, self.sort, self.filter_text):
            slices.add_row(*table_cells(row))
        line = self.query_one("#line", DataTable)
        line.clear()
        for cells in line_cells(snapshot.line):
            line.add_row(*cells)
        alerts = [f"{a.severity}: {a.name}" + (f" on {a.where}" if a.where else "") for a in snapshot.alerts]
        problems = [f"not shown: {p}" for p in snapshot.problems]
        self.query_one("#alerts", Static).update("\n".join(alerts + problems) or "No alert is firing.")

    def action_next_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.redraw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_text = event.value.strip()
        event.input.remove_class("shown")
        self.query_one("#slices", DataTable).focus()
        self.redraw()

    def key_escape(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.filter_text = ""
        self.redraw()
