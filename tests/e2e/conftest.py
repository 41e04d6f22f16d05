from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.platform import Platform


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    running = Platform(tmp_path)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def make_platform(tmp_path: Path) -> Iterator[object]:
    made: list[Platform] = []

    def make(unclaimed: tuple[str, ...] = (), **settings: object) -> Platform:
        created = Platform(tmp_path / f"p{len(made)}", dict(settings), unclaimed=unclaimed)
        made.append(created)
        return created

    yield make
    for p in made:
        p.stop()
