from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.platform import Platform


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    running = Platform(tmp_path)
    try:  # stopped even when it fails to start
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def make_platform(tmp_path: Path) -> Iterator[object]:
    made: list[Platform] = []

    def make(unclaimed: tuple[str, ...] = (), **settings: object) -> Platform:
        created = Platform(tmp_path / f"p{len(made)}", dict(settings), unclaimed=unclaimed)
        made.append(created)
        return created

    yield make
    stop_all(made)


def stop_all(platforms: list[Platform]) -> None:
    """Stop every platform, even when stopping one fails; then raise the first failure."""
    failures = []
    for p in platforms:
        try:
            p.stop()
        except AssertionError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
