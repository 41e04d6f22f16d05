"""Times in the reader's own clock and in words (portal/views.py), from literal instants."""

from datetime import UTC, datetime

from portal import views
from spawner.words import instant

NOW = datetime(2026, 11, 25, 8, 37, tzinfo=UTC).timestamp()  # 09:37 in Berlin


def test_times_are_the_readers_clock_without_an_offset() -> None:
    berlin = views.zone("Europe/Berlin")
    assert views.clock_text(NOW + 4 * 60, NOW, berlin) == "09:41"
    assert views.when_text(NOW + 4 * 60, NOW, berlin) == "09:41 (in 4 min)"
    assert views.when_text(NOW - 25 * 60, NOW, berlin) == "09:12 (25 min ago)"
    assert views.clock_text(NOW - 86400, NOW, berlin) == "yesterday 09:37"
    assert "+00:00" not in views.clock_text(NOW, NOW, views.zone(None))
    assert views.clock_text(NOW, NOW, views.zone(None)) == "08:37 UTC"  # an unknown zone says which clock
    assert views.zone("Not/AZone") is UTC


def test_a_messages_instants_become_the_readers_time() -> None:
    said = f"You are next in line. Expected start: {instant(NOW + 240)} at the latest."
    assert views.times_in_words(said, NOW, views.zone("Europe/Berlin")) == (
        "You are next in line. Expected start: 09:41 (in 4 min) at the latest."
    )


def test_reservations_read_in_the_readers_clock_with_the_class_only_where_several_are_listed() -> None:
    from zoneinfo import ZoneInfo

    from spawner.waitline import Reservation

    now = 1_790_000_000.0  # a Tuesday, 14:13 in Berlin
    booked = [Reservation("ml101", 8 << 30, now + 3600, now + 7200, by="tess")]
    berlin = ZoneInfo("Europe/Berlin")
    every = views.reservation_rows(booked, now, berlin)
    assert every == [
        {
            "class": "ml101",
            "GPU memory": "8 GiB",
            "from": views.clock_text(now + 3600, now, berlin),
            "until": views.clock_text(now + 7200, now, berlin),
            "by": "tess",
        }
    ]
    assert every[0]["from"] != views.clock_text(now + 3600, now, views.UTC)  # the reader's zone, not UTC
    assert views.reservation_rows(booked, now, berlin, with_class=False) == [
        {k: v for k, v in every[0].items() if k != "class"}
    ]
