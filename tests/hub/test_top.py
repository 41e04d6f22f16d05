"""`gpuslice top`: the snapshot read from what the hub really serves, its rows, and the Textual view."""

import asyncio
import json

from prometheus_client import CollectorRegistry, generate_latest

from hub.metrics import AllocationCollector
from hub.top import Card, Slice, Snapshot, rows, text, to_json
from hub.top_app import TopApp
from hub.top_source import cards_from_metrics, firing_from_json, idle_times, line_from_json
from spawner import line_admin
from spawner.inventory import Gpu
from spawner.ledger import Held

GiB = 2**30


def _exposition() -> str:
    """/hub/metrics' text for two 16 GiB cards, amy and ben holding slices, as the hub's collector writes it."""
    gpus = [Gpu("localhost", i, "T4", 16 * GiB, simulated=True) for i in (0, 1)]
    holds = [
        Held("amy/", 0, "amy", "", 4 * GiB),
        Held("ben/big", 0, "ben", "big", 8 * GiB),
        Held("cat/", 1, "cat", "", 4 * GiB),
    ]
    registry = CollectorRegistry()
    registry.register(AllocationCollector("localhost", lambda: gpus, lambda: holds))
    return generate_latest(registry).decode()


NOW = 1_800_000_000.0
USERS = [
    {"name": "amy", "servers": {"": {"last_activity": "2027-01-15T07:50:00Z"}}},  # 10 min before NOW
    {"name": "ben", "servers": {"big": {"last_activity": None}}},
    {"name": "cat", "servers": {"": {"last_activity": "2027-01-15T06:00:00Z"}}},
]


def _snapshot() -> Snapshot:
    cards = cards_from_metrics(_exposition(), idle_times(USERS, NOW))
    waiting = [line_admin.Waiting(1, "dan", "", "4 GiB", "ml101", NOW - 300, False, NOW + 600)]
    line = line_from_json({"line": line_admin.to_json(waiting)}, NOW)
    return Snapshot(cards, line, (), (), NOW)


def test_cards_and_slices_come_from_the_hubs_own_metrics() -> None:
    cards = _snapshot().cards
    assert [(c.index, c.capacity_bytes, c.simulated) for c in cards] == [("0", 16 * GiB, True), ("1", 16 * GiB, True)]
    held = [(s.user, s.server, s.memory_bytes) for s in cards[0].slices]
    assert held == [("amy", "", 4 * GiB), ("ben", "big", 8 * GiB)]
    assert cards[0].held_bytes == 12 * GiB
    amy, ben = cards[0].slices
    assert amy.idle_s == 600 and ben.idle_s is None  # never active: not known


def test_rows_sort_and_filter() -> None:
    snapshot = _snapshot()
    assert [r.user for r in rows(snapshot, "idle")] == ["cat", "amy", "ben"]  # longest idle first
    assert rows(snapshot, "size")[0].user == "ben"
    assert [r.user for r in rows(snapshot, "card", "big")] == ["ben"]
    free = Snapshot((Card("n", "0", "T4", 16 * GiB, False),))
    assert [(r.user, r.card_free_bytes) for r in rows(free)] == [("", 16 * GiB)]  # a free card is a row too


def test_the_text_view_says_who_holds_what_and_who_waits() -> None:
    view = text(_snapshot(), "user")
    assert "2 cards (simulated), 16 GiB of 32 GiB held by 3 servers; 1 waiting; 0 alerts firing" in view
    assert "amy" in view and "10 min" in view and "2 h 00 min" in view  # cat: idle two hours
    assert "1. dan (default server) 4 GiB, waiting 5 min" in view
    assert json.loads(to_json(_snapshot()))["cards"][0]["held_bytes"] == 12 * GiB


def test_alerts_firing_are_listed_without_the_heartbeat() -> None:
    alerts = [
        {"labels": {"alertname": "Watchdog", "severity": "none"}, "status": {"state": "active"}},
        {"labels": {"alertname": "GpuHot", "severity": "warning", "gpu": "1"}, "status": {"state": "active"}},
        {"labels": {"alertname": "GpuXid", "severity": "critical", "node": "n1"}, "status": {"state": "suppressed"}},
    ]
    assert [(a.name, a.where) for a in firing_from_json(alerts)] == [("GpuHot", "gpu 1")]


def test_the_terminal_view_sorts_and_filters_with_keys() -> None:
    async def drive() -> tuple[list[str], list[str], str]:
        app = TopApp(_snapshot, interval_s=60)
        async with app.run_test() as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            table = app.query_one("#slices")
            by_card = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
            await pilot.press("s", "s")  # card -> user -> idle
            await pilot.press("slash", *"am", "enter")
            filtered = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
            return by_card, filtered, f"{app.sort} {app.filter_text}"

    by_card, filtered, state = asyncio.run(drive())
    assert by_card == ["amy", "ben", "cat"]
    assert filtered == ["amy"]
    assert state == "idle am"


def test_a_slice_without_activity_sorts_last_by_idle() -> None:
    cards = (Card("n", "0", "T4", 16 * GiB, False, (Slice("a", "", GiB, None), Slice("b", "", GiB, 5.0))),)
    assert [r.user for r in rows(Snapshot(cards), "idle")] == ["b", "a"]
