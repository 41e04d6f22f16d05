"""Turns to start: a few servers at a time, the others in order, each told its place."""

import asyncio

import pytest

from spawner.start_turns import StartTurns, TurnTimeoutError, default_limit, machine_turns, turn_words

Told = dict[str, list[int]]


async def _hold(turns: StartTurns, name: str, told: Told, holding: list[str], go: asyncio.Event) -> None:
    async with turns.turn(lambda ahead: told.setdefault(name, []).append(ahead), max_wait=30):
        holding.append(name)
        await go.wait()
        holding.remove(name)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_first_ones_start_at_once_and_the_others_wait_in_order_told_their_place() -> None:
    async def scenario() -> None:
        turns = StartTurns(2)
        told: dict[str, list[int]] = {}
        holding: list[str] = []
        gates = {name: asyncio.Event() for name in "abcde"}
        tasks = {name: asyncio.ensure_future(_hold(turns, name, told, holding, gates[name])) for name in "abcde"}
        await _settle()
        assert holding == ["a", "b"] and turns.starting == 2 and turns.waiting == 3
        assert told == {"c": [0], "d": [1], "e": [2]}  # a and b were never told to wait
        gates["b"].set()  # b answers: c takes its turn, d and e move up
        await _settle()
        assert holding == ["a", "c"] and turns.starting == 2
        assert told == {"c": [0], "d": [1, 0], "e": [2, 1]}
        for name in "acde":
            gates[name].set()
        await asyncio.gather(*tasks.values())
        assert holding == [] and turns.starting == 0 and turns.waiting == 0

    asyncio.run(scenario())


def test_a_cancelled_wait_leaves_the_line_and_the_others_move_up() -> None:
    async def scenario() -> None:
        turns = StartTurns(1)
        told: dict[str, list[int]] = {}
        holding: list[str] = []
        go = asyncio.Event()
        tasks = [asyncio.ensure_future(_hold(turns, name, told, holding, go)) for name in "abc"]
        await _settle()
        tasks[1].cancel()  # b's student pressed Cancel (or JupyterHub gave up on it)
        await _settle()
        assert told["c"] == [1, 0] and turns.waiting == 1
        go.set()
        await asyncio.gather(tasks[0], tasks[2])
        assert tasks[1].cancelled() and turns.starting == 0 and turns.waiting == 0

    asyncio.run(scenario())


def test_a_turn_granted_as_its_wait_is_cancelled_goes_to_the_next_one() -> None:
    async def scenario() -> None:
        turns = StartTurns(1)
        second_in = asyncio.Event()

        async def second() -> None:
            async with turns.turn(lambda _: None, 30):
                second_in.set()

        async def third() -> None:
            async with turns.turn(lambda _: None, 30):
                pass

        first = turns.turn(lambda _: None, 30)
        await first.__aenter__()
        two, three = asyncio.ensure_future(second()), asyncio.ensure_future(third())
        await _settle()
        await first.__aexit__(None, None, None)  # hands the turn to two, without yielding to it
        two.cancel()  # ... whose student cancels before it runs again
        await asyncio.wait_for(three, 5)  # three gets the turn two could not use
        assert two.cancelled() and not second_in.is_set()
        assert turns.starting == 0 and turns.waiting == 0

    asyncio.run(scenario())


def test_a_wait_longer_than_allowed_fails_saying_what_to_do() -> None:
    async def scenario() -> None:
        turns = StartTurns(1)
        go = asyncio.Event()
        holder = asyncio.ensure_future(_hold(turns, "a", {}, [], go))
        await _settle()
        with pytest.raises(TurnTimeoutError, match=r"busy starting other servers.*Press Start again"):
            async with turns.turn(lambda _: None, max_wait=0.05):
                raise AssertionError("no turn while the only one is held")
        assert turns.waiting == 0
        go.set()
        await holder
        assert turns.starting == 0

    asyncio.run(scenario())


def test_the_words_a_waiting_student_reads() -> None:
    assert turn_words(0, 4) == "Waiting for a turn to start: yours is next. This machine starts 4 servers at a time."
    assert turn_words(1, 4).startswith("Waiting for a turn to start: 1 server waits before yours.")
    assert turn_words(12, 1).endswith("12 servers wait before yours. This machine starts 1 server at a time.")


def test_one_set_of_turns_per_hub_and_a_sensible_default() -> None:
    async def same() -> bool:
        return machine_turns(3) is machine_turns(3) and machine_turns(3) is not machine_turns(4)

    assert asyncio.run(same())
    assert default_limit() >= 2
    with pytest.raises(ValueError, match="1 or more"):
        StartTurns(0)


def test_the_hubs_metrics_count_the_servers_starting_and_those_waiting_their_turn() -> None:
    from prometheus_client import REGISTRY

    from spawner import metrics

    def sample(state: str) -> float | None:
        return REGISTRY.get_sample_value("gpuslice_server_starts", {"state": state})

    async def scenario() -> None:
        turns = StartTurns(1)
        metrics.follow_turns(lambda: turns.starting, lambda: turns.waiting)
        go = asyncio.Event()
        tasks = [asyncio.ensure_future(_hold(turns, name, {}, [], go)) for name in "abc"]
        await _settle()
        assert (sample("starting"), sample("waiting")) == (1, 2)
        go.set()
        await asyncio.gather(*tasks)
        assert (sample("starting"), sample("waiting")) == (0, 0)

    asyncio.run(scenario())
