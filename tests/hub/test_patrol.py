"""Patrols on simulated cards: each free card checked while held, a failing one out of placement until cleared."""

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hub.metrics import PatrolCollector
from hub.patrol import checker, patrol_forever, patrol_once
from spawner.card_health import CardLedger
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.ledger import Held
from spawner.patrol import RETRY_HELD_S, Check, due_cards, next_patrol_in, simulated_check, with_health
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import Entry, admit

CARDS = simulated_gpus("3x16GiB:T4")


def test_a_patrol_checks_the_free_cards_only_and_takes_a_failing_one_out(tmp_path: Path) -> None:
    ledger = CardLedger(tmp_path / "ledger.sqlite")
    ledger.allocate("ann/", lambda held: [Held("ann/", 0, "ann", "", 4 * GiB)])
    faults = tmp_path / "faults.json"
    faults.write_text('[{"gpu": 2, "patrol": "fail"}, {"gpu": 0, "patrol": "fail"}]')
    seen_held: list[set[str]] = []

    def check(gpu, now):  # type: ignore[no-untyped-def]
        seen_held.append({h.key for h in ledger.holdings()})
        return checker(CARDS, faults)(gpu, now)

    made = patrol_once(ledger, CARDS, check, now=lambda: 100.0)
    assert [(c.gpu, c.healthy) for c in made] == [(1, True), (2, False)]  # card 0 is ann's: never taken from her
    assert seen_held == [{"ann/", "patrol/gpu-1"}, {"ann/", "patrol/gpu-2"}]  # each held while checked
    assert {h.key for h in ledger.holdings()} == {"ann/"}  # and released
    assert ledger.out_of_placement() == {2}

    # Out of placement: the line puts a whole-card request on card 1, never on card 2.
    inventory = build_local(
        with_health(CARDS, ledger.out_of_placement()), [(0, Held("ann/", 0, "ann", "", 4 * GiB).allocation())]
    )
    wants = [
        Entry(f"u{i}/", f"u{i}", Demand(slice_units=float(16 * GiB)), 16 * GiB, None, 1.0 + i, seen=5.0)
        for i in range(2)
    ]
    placed = admit(wants, inventory, budgets={}, group_bytes={}, now=5.0)
    assert [inventory.nodes[0].gpus[a.choice.gpus[0]].index for a in placed] == [1]

    # A later pass does not put it back; an admin does.
    faults.write_text("[]")
    patrol_once(ledger, CARDS, checker(CARDS, faults), now=lambda: 200.0)
    assert ledger.out_of_placement() == {2}
    assert ledger.clear(2, "root") and not ledger.clear(2, "root")
    assert ledger.out_of_placement() == set() and {h.gpu: h.cleared_by for h in ledger.health()}[2] == "root"

    registry = CollectorRegistry()
    registry.register(PatrolCollector("localhost", ledger.health))
    assert registry.get_sample_value("gpuslice_patrol_healthy", {"node": "localhost", "gpu": "2"}) == 1.0
    assert (
        registry.get_sample_value("gpuslice_patrol_checked_timestamp_seconds", {"node": "localhost", "gpu": "1"})
        == 200.0
    )


def test_a_simulated_card_fails_on_an_injected_patrol_fault_or_a_hardware_xid() -> None:
    card = CARDS[1]
    assert simulated_check(card, [], 1.0) == Check(1, True, "memory and compute test passed (T4, simulated)", 1.0)
    assert not simulated_check(card, [{"gpu": 1, "xid": 79}], 1.0).healthy
    assert simulated_check(card, [{"gpu": 1, "xid": 13}], 1.0).healthy  # a user's program faulting, not the card
    assert simulated_check(card, [{"gpu": 0, "patrol": "fail"}], 1.0).healthy


class EnoughSleepsError(Exception):
    """Ends patrol_forever after the sleeps a test wants."""


def test_a_restarted_patrol_checks_only_the_cards_that_fell_due_and_sleeps_until_the_next(tmp_path: Path) -> None:
    ledger = CardLedger(tmp_path / "ledger.sqlite")
    day = 6 * 3600.0
    patrol_once(ledger, CARDS, checker(CARDS, None), now=lambda: 1000.0)  # the first start: every free card
    ledger.record_check(Check(1, True, "checked again later", 1000.0 + day / 2))

    # Six hours after the first round the hub restarts: cards 0 and 2 are due, card 1 is not
    # (checked three hours ago); ann holds card 2, so it is not taken from her.
    ledger.allocate("ann/", lambda held: [Held("ann/", 2, "ann", "", 4 * GiB)])
    made = patrol_once(ledger, CARDS, checker(CARDS, None), now=lambda: 1000.0 + day, interval_s=day)
    assert [c.gpu for c in made] == [0]
    assert due_cards(CARDS, [2], ledger.health(), 1000.0 + day, day) == []
    # Card 2 is overdue but held: tried again in RETRY_HELD_S, not at once and not in six hours.
    assert next_patrol_in(CARDS, ledger.health(), 1000.0 + day, day) == RETRY_HELD_S
    ledger.release("ann/")
    assert due_cards(CARDS, [], ledger.health(), 1000.0 + day, day) == [2]
    patrol_once(ledger, CARDS, checker(CARDS, None), now=lambda: 1000.0 + day, interval_s=day)
    # Card 1, checked half an interval after the first round, is the next due: half an interval from now.
    assert next_patrol_in(CARDS, ledger.health(), 1000.0 + day, day) == day / 2
    assert next_patrol_in(CARDS, [], 0.0, day) == RETRY_HELD_S  # never checked (and so held): soon


def test_the_patrol_service_sleeps_as_the_schedule_says_and_a_failed_round_is_not_its_last(tmp_path: Path) -> None:
    ledger = CardLedger(tmp_path / "ledger.sqlite")
    checks: list[int] = []
    fail_next = [True]

    def check(gpu, now):  # type: ignore[no-untyped-def]
        if fail_next[0]:
            fail_next[0] = False
            raise OSError("the check could not start")
        checks.append(gpu.index)
        return Check(gpu.index, True, "passed", now)

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise EnoughSleepsError

    with pytest.raises(EnoughSleepsError):
        patrol_forever(ledger, CARDS, check, interval_s=3600.0, sleep=sleep)
    assert slept[0] == RETRY_HELD_S  # the failed round: tried again soon
    assert checks == [0, 1, 2]  # the next round checked every card nobody had checked
    assert 3500 < slept[1] <= 3600  # then nothing is due for an interval
    assert checks == [0, 1, 2] and 0 < slept[2] <= 3600  # the third round found nothing due
