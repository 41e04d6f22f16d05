"""Which servers' ends a waiting spawn waits for (spawner/line.py ``line_view``)."""

from spawner.ledger import Held
from spawner.line import line_view
from spawner.placement import Demand
from spawner.waitline import Entry

GiB = 2**30


def waiting(key: str, arrived: float, group: str | None) -> Entry:
    return Entry(key, key.rstrip("/"), Demand(slice_units=4.0 * GiB), 4 * GiB, group, arrived, 0, seen=arrived)


def held(key: str, group: str | None) -> Held:
    return Held(key, 0, key.rstrip("/"), "", 4 * GiB, group=group)


HOLDS = [held("s1/", "ml101"), held("s2/", "ml101"), held("x1/", None), held("x2/", "bio")]


def test_held_back_by_the_budget_it_waits_for_classmates_servers_after_classmates_ahead() -> None:
    ahead = [waiting("s4/", 1, "ml101"), waiting("y1/", 2, None), waiting("s5/", 3, "ml101")]
    view = line_view(waiting("s3/", 4, "ml101"), ahead, HOLDS, "ml101")
    assert view.position == 4
    assert [h.key for h in view.freeing] == ["s1/", "s2/"]
    assert view.start_rank == 3  # s4 and s5 first; y1 waits on other servers


def test_held_back_by_the_gpus_it_waits_for_every_server_after_everyone_ahead() -> None:
    ahead = [waiting("s4/", 1, "ml101"), waiting("y1/", 2, None)]
    view = line_view(waiting("s3/", 4, "ml101"), ahead, HOLDS, None)
    assert (view.position, view.start_rank, view.freeing, view.budget_group) == (3, 3, HOLDS, None)
