"""portal/sources/snapshot.py: a page takes the latest value at once while the source is slow."""

import threading
import time

import pytest

from portal.data.errors import SourceUnavailableError
from portal.sources import snapshot
from portal.sources.snapshot import Snapshot


class SlowSource:
    """A source whose reads return only when the test lets them (a hub busy starting a class)."""

    def __init__(self) -> None:
        self.reads = 0
        self.go = threading.Semaphore(0)
        self.begun = threading.Semaphore(0)
        self.fail = False

    def read(self) -> int:
        self.begun.release()
        self.go.acquire()
        self.reads += 1
        if self.fail:
            raise SourceUnavailableError("JupyterHub did not answer (timed out)")
        return self.reads


def test_a_reader_gets_the_latest_value_at_once_while_the_next_read_hangs() -> None:
    source = SlowSource()
    shared = Snapshot(source.read, every_s=0.0)
    source.go.release()
    assert shared.get() == 1  # the first read: waited for
    assert source.begun.acquire(timeout=10) and source.begun.acquire(timeout=10)  # the second is under way
    began = time.monotonic()
    assert shared.get(wait_s=10) == 1  # the second read hangs in the background: not waited for
    assert time.monotonic() - began < 1.0
    source.go.release()  # the read that hung ends; it began before the refresh below, so it is not enough
    source.go.release()
    shared.refresh(wait_s=10)  # after a change made from the portal: a read begun after it, waited for
    assert shared.get() == 3


def test_a_source_that_fails_briefly_keeps_its_last_value_and_one_that_stays_down_is_said_so() -> None:
    source = SlowSource()
    shared = Snapshot(source.read, every_s=0.0, too_old_s=3600)
    source.go.release()
    assert shared.get() == 1
    source.fail = True
    source.go.release()
    source.go.release()
    shared.refresh(wait_s=10)
    assert shared.get() == 1  # a moment ago is still worth showing
    never = Snapshot(SlowSource().read, every_s=0.0)
    with pytest.raises(SourceUnavailableError, match="did not answer in 0 s"):
        never.get(wait_s=0.01)
    down = SlowSource()
    down.fail = True
    failing = Snapshot(down.read, every_s=0.0)
    down.go.release()
    with pytest.raises(SourceUnavailableError, match="JupyterHub did not answer"):
        failing.get(wait_s=10)


def test_nobody_reading_stops_the_looks_and_a_read_starts_them_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "IDLE_AFTER_S", 0.0)
    source = SlowSource()
    shared = Snapshot(source.read, every_s=0.0)
    source.go.release()
    assert shared.get() == 1
    deadline = time.monotonic() + 10
    while shared._thread is not None and time.monotonic() < deadline:  # nobody read since: it stops
        time.sleep(0.01)
    assert shared._thread is None and source.reads == 1  # no further look while nobody reads
    source.go.release()
    shared.refresh(wait_s=10)
    assert shared.get() == 2


def test_a_refresh_waits_for_a_read_begun_after_it_not_the_one_already_under_way() -> None:
    """After a change made from the portal, a read that asked the source before the change is stale.

    Seen in CI: an admin cancelled a waiting request, and the queue's next redraw showed it again,
    because the read that ended first after the cancel had begun before it.
    """
    line = ["dan"]
    began, go = threading.Semaphore(0), threading.Semaphore(0)

    def read() -> list[str]:
        answer = list(line)  # the source answers as the read begins; the reply arrives later
        began.release()
        go.acquire()
        return answer

    shared = Snapshot(read, every_s=0.0)
    go.release()
    assert shared.get() == ["dan"]
    assert began.acquire(timeout=10) and began.acquire(timeout=10)  # the second read is under way
    line.clear()  # the cancel, made while that read waits for its reply
    refresher = threading.Thread(target=shared.refresh, kwargs={"wait_s": 60})
    refresher.start()
    go.release()  # the read under way ends, with the line from before the cancel
    refresher.join(timeout=2)
    assert refresher.is_alive(), "the refresh took a read begun before the change for a fresh one"
    go.release()  # the read begun after the refresh
    refresher.join(timeout=30)
    assert not refresher.is_alive() and shared.get() == []
