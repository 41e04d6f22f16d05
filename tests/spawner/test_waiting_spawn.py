"""A local spawn that waits in line: placed when room frees, cancelled cleanly, refused with choices."""

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spawner import metrics
from spawner.ledger import Ledger
from spawner.lifecycle import LedgerGpuMixin
from spawner.request import GpuRefused
from spawner.waitline import Reservation

GiB = 2**30
# The line is what these tests are about: users in no class here get rules without limits (an
# explicit choice a settings file may make; the built-in default rules are finite).
NO_LIMITS = {"name": "default", "max_slice": None, "max_gpus": None, "budget": None, "servers_per_user": None}


class _HubSpawner:
    """What the mixin uses of JupyterHub's Spawner here."""

    start_timeout = 300

    def run_pre_spawn_hook(self) -> None:
        return None

    def clear_state(self) -> None:
        return None


class Spawner(LedgerGpuMixin, _HubSpawner):
    def __init__(self, ledger: Path, user: str, **options: Any) -> None:
        super().__init__(
            gpu_simulate="2x16GiB:T4", gpu_ledger_path=str(ledger), gpu_line_poll=0.05, gpu_groups=[NO_LIMITS]
        )
        self.user = SimpleNamespace(name=user, groups=[], admin=False)
        self.name = ""
        self.user_options = options
        self.log = logging.getLogger("test")


def fill(ledger: Path) -> list[Spawner]:
    """Four 8 GiB servers: both cards full."""
    running = []
    for user in ("a", "b", "c", "d"):
        spawner = Spawner(ledger, user, gpu_memory="8GiB")
        _, spawner._gpu_holds = spawner.allocate()
        running.append(spawner)
    return running


async def wait_for_stage(spawner: Spawner, text: str) -> str:
    for _ in range(200):
        for stage in spawner._gpu_stages or []:
            if text in stage.message:
                return stage.message
        await asyncio.sleep(0.02)
    raise AssertionError(f"no stage with {text!r}: {spawner._gpu_stages}")


def test_a_waiting_spawn_is_placed_when_a_server_stops(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    running = fill(ledger)
    late = Spawner(ledger, "late", gpu_memory="8GiB", wait=True)
    later = Spawner(ledger, "later", gpu_memory="8GiB", wait=True)

    async def scenario() -> None:
        request, holds = late.allocate()
        assert holds is None
        assert later.allocate()[1] is None
        waiting = asyncio.ensure_future(late._wait_in_line(request, "default"))
        also = asyncio.ensure_future(later._wait_in_line(request, "default"))
        assert "You are next in line." in await wait_for_stage(late, "Waiting in line")
        assert "You are 2nd in line: 1 person is before you." in await wait_for_stage(later, "Waiting in line")
        running[0].clear_state()  # a classmate stops: 8 GiB free
        holds = await asyncio.wait_for(waiting, 10)
        assert [(h.key, h.memory_bytes) for h in holds] == [("late/", 8 * GiB)]
        assert not also.done()
        also.cancel()  # the user stops the pending spawn
        with pytest.raises(asyncio.CancelledError):
            await also

    asyncio.run(scenario())
    assert Ledger(ledger).line() == []
    assert sorted(h.key for h in Ledger(ledger).holdings()) == ["b/", "c/", "d/", "late/"]


def test_without_wait_the_refusal_offers_cpu_the_largest_fit_and_the_line(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    fill(ledger)[0].clear_state()
    Spawner(ledger, "e", gpu_memory="4GiB").allocate()  # 4 GiB left on one card
    with pytest.raises(GpuRefused) as refused:
        Spawner(ledger, "f", gpu_memory="8GiB").allocate()
    message = refused.value.jupyterhub_message
    assert 'Or: start CPU-only now (gpu_memory "0"); start 4 GiB now (gpu_memory "4GiB");' in message
    assert 'wait in line for it (add "wait": true)' in message
    assert Ledger(ledger).line() == []


def test_nobody_jumps_the_line_without_waiting(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    running = fill(ledger)
    assert Spawner(ledger, "late", gpu_memory="8GiB", wait=True).allocate()[1] is None
    running[0].clear_state()
    with pytest.raises(GpuRefused, match="1 request"):
        Spawner(ledger, "pushy", gpu_memory="8GiB").allocate()


def offered(reason: str) -> float:
    return metrics.SPAWN_OFFERED_LINE.labels(reason=reason)._value.get()


def test_a_refusal_that_offers_the_line_is_counted_apart_from_one_waiting_cannot_help(tmp_path: Path) -> None:
    """SpawnFailureRateHigh counts no refusal; the line's own are told apart for the runbook."""
    ledger = tmp_path / "ledger.sqlite"
    fill(ledger)
    capacity, invalid = offered("capacity"), offered("invalid")
    spawner = Spawner(ledger, "f", gpu_memory="8GiB")
    with pytest.raises(GpuRefused) as full:
        spawner.allocate()  # counts its refusal
    assert full.value.waitable and offered("capacity") == capacity + 1
    spawner._refused(GpuRefused(400, "gpu_memory: 8 GiB?", "invalid"))
    assert offered("invalid") == invalid  # bad options: waiting would not help, no line offered


def test_only_a_waiting_spawn_gets_the_line_on_top_of_start_timeout(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path / "ledger.sqlite", "w", gpu_memory="4GiB", wait=True)
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 300 + spawner.gpu_line_max_wait
    spawner.user_options = {"gpu_memory": "4GiB"}
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 300


def test_a_spawn_cancelled_by_a_teacher_ends_saying_who_and_holds_nothing(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    fill(ledger)
    late = Spawner(ledger, "late", gpu_memory="8GiB", wait=True)

    async def scenario() -> None:
        request, holds = late.allocate()
        assert holds is None
        waiting = asyncio.ensure_future(late._wait_in_line(request, "default"))
        await wait_for_stage(late, "Waiting in line")
        assert Ledger(ledger).cancel("late/", "teacher tom in the portal") is not None
        with pytest.raises(GpuRefused) as refused:
            await asyncio.wait_for(waiting, 10)
        assert refused.value.jupyterhub_message == (
            "Your place in the GPU line was cancelled by teacher tom in the portal; no GPU is held."
            " Start again to wait once more."
        )

    asyncio.run(scenario())
    assert Ledger(ledger).line() == []
    assert "late/" not in {h.key for h in Ledger(ledger).holdings()}
    assert Ledger(ledger).latest_events()["late/"].kind == "refused"


def test_a_reservation_keeps_free_memory_for_its_class_only(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    Ledger(ledger).reserve(Reservation("ml101", 24 * GiB, 0, 2e9, "admin"), lambda new, old: None)
    outsider = Spawner(ledger, "out", gpu_memory="8GiB")  # 32 GiB free, 24 kept: 8 GiB for others
    assert outsider.allocate()[1] is not None
    second = Spawner(ledger, "out2", gpu_memory="8GiB")
    with pytest.raises(GpuRefused) as refused:
        second.allocate()
    assert "reserved for another class" in refused.value.jupyterhub_message


def test_a_waiting_spawns_words_come_from_its_turns_look_at_the_line_not_another_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    fill(ledger)
    late = Spawner(ledger, "late", gpu_memory="8GiB", wait=True)
    reads: list[str] = []
    for name in ("line", "holdings"):
        real = getattr(Ledger, name)
        monkeypatch.setattr(Ledger, name, lambda self, real=real, name=name: reads.append(name) or real(self))

    async def scenario() -> None:
        request, holds = late.allocate()
        assert holds is None
        waiting = asyncio.ensure_future(late._wait_in_line(request, "default"))
        assert "You are next in line." in await wait_for_stage(late, "Waiting in line")
        await asyncio.sleep(0.2)  # a few more looks
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())
    assert reads == []  # each look is the turn's one transaction


def classmate(ledger: Path, user: str, **options: Any) -> Spawner:
    """A member of class ml101, whose GPU budget is two 4 GiB slices."""
    spawner = Spawner(ledger, user, **options)
    spawner.user.groups = [SimpleNamespace(name="ml101")]
    spawner.gpu_groups = [{"name": "ml101", "max_slice": "4GiB", "budget": "8GiB"}, NO_LIMITS]
    return spawner


def test_a_spawn_held_back_by_its_class_budget_says_so_and_waits_for_its_classmates_only(tmp_path: Path) -> None:
    """Both cards have room (24 GiB free), the class's budget has none: the words say it is the
    class's budget, and the estimated start comes from the classmates' servers, not the outsider's."""
    ledger = tmp_path / "ledger.sqlite"
    for user in ("s1", "s2"):
        classmate(ledger, user, gpu_memory="4GiB").allocate()
    Spawner(ledger, "outsider", gpu_memory="4GiB").allocate()
    third = classmate(ledger, "s3", gpu_memory="4GiB", wait=True)
    activity = {"s1/": 1000.0, "s2/": 2000.0, "outsider/": 10.0}  # the outsider went idle long ago
    third._last_activity = lambda: activity  # type: ignore[method-assign]

    async def scenario() -> str:
        request, holds = third.allocate()
        assert holds is None
        waiting = asyncio.ensure_future(third._wait_in_line(request, "default"))
        words = await wait_for_stage(third, "Waiting in line")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return words

    words = asyncio.run(scenario())
    assert "You are next in line." in words
    assert words.endswith(
        "Your class ml101 is using its whole GPU budget (8 GiB) now: you start when a classmate stops."
    )
    view = third._gpu_line_view
    assert view is not None and sorted(h.key for h in view.freeing) == ["s1/", "s2/"]
    # s1's end, not the outsider's: idle for the timeout, then stopped at its warning's announced time.
    report_allowance = third.gpu_stop_after - third.gpu_warning_lead
    assert third.gpu_estimated_start(0.0) == 1000.0 + third.gpu_idle_timeout + report_allowance


def test_the_form_waits_for_the_gpu_it_asks_for_and_never_starts_without_one_silently(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path / "ledger.sqlite", "ann")
    assert spawner.options_from_form({"gpu": ["4GiB"], "image": ["default"]})["wait"] is True
    assert spawner.options_from_form({"gpu": ["gpus:1"], "image": ["default"]})["wait"] is True
    assert "wait" not in spawner.options_from_form({"gpu": ["0"], "image": ["default"]})  # nothing to wait for


def test_with_the_class_budget_full_the_forms_start_joins_the_line_at_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    for user in ("s1", "s2"):
        classmate(ledger, user, gpu_memory="4GiB").allocate()
    third = classmate(ledger, "s3", **third_options(tmp_path))
    _, holds = third.allocate()  # not refused: no "Error" page, no button to press first
    assert holds is None and [e.key for e in Ledger(ledger).line()] == ["s3/"]


def third_options(tmp_path: Path) -> dict[str, Any]:
    """What the spawn form posts for the class's 4 GiB slice, as the form's own reader turns it into options."""
    return dict(Spawner(tmp_path / "unused.sqlite", "x").options_from_form({"gpu": ["4GiB"], "image": ["default"]}))


def test_a_whole_card_beyond_the_class_budget_is_refused_with_the_budget_in_all_not_0_b_in_use(
    tmp_path: Path,
) -> None:
    """The class holds 8 of its 8 GiB and someone waits: the refusal says the budget can never hold a
    16 GiB card (it used to say "0 B of it in use: 8 GiB left")."""
    ledger = tmp_path / "ledger.sqlite"
    for user in ("s1", "s2"):
        classmate(ledger, user, gpu_memory="4GiB").allocate()
    classmate(ledger, "s3", gpu_memory="4GiB", wait=True).allocate()  # waits: the line is not empty
    whole = classmate(ledger, "s4", gpu_memory="0", gpus=1, wait=True)
    with pytest.raises(GpuRefused) as refused:
        whole.allocate()
    words = refused.value.jupyterhub_message
    assert "budget of 8 GiB in all, less than the 16 GiB asked for" in words, words
    assert "0 B" not in words and "in use" not in words
    assert [e.key for e in Ledger(ledger).line()] == ["s3/"]  # nothing held, nobody added
