"""Patrols on simulated cards: each free card checked while held, a failing one out of placement until cleared."""

from pathlib import Path

from prometheus_client import CollectorRegistry

from hub.metrics import PatrolCollector
from hub.patrol import checker, patrol_once
from spawner.card_health import CardLedger
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.ledger import Held
from spawner.patrol import Check, simulated_check, with_health
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
