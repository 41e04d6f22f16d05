"""Activity is never in the future (hub/activity.py), on JupyterHub's own ORM in SQLite."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from jupyterhub import orm

from hub.activity import at_most_now, clamp_future_activity

NOW = datetime(2026, 3, 2, 9, 0, 0)  # naive UTC, as JupyterHub keeps its timestamps


def test_a_later_stamp_is_now_and_an_earlier_one_is_kept() -> None:
    aware_now = NOW.replace(tzinfo=UTC)
    assert at_most_now(NOW + timedelta(minutes=59), aware_now) == NOW
    assert at_most_now(NOW - timedelta(minutes=5), aware_now) == NOW - timedelta(minutes=5)
    assert at_most_now(aware_now + timedelta(minutes=59), aware_now) == aware_now
    assert at_most_now(None, aware_now) is None


@pytest.fixture
def db() -> Iterator[object]:
    session = orm.new_session_factory("sqlite:///:memory:")()
    yield session
    session.close()


def test_a_server_reported_59_minutes_ahead_is_active_now_not_for_an_hour(db: object) -> None:
    clamp_future_activity()
    clamp_future_activity()  # twice (two config files): one listener
    user = orm.User(name="bob")
    db.add(user)  # type: ignore[attr-defined]
    spawner = orm.Spawner(user=user, name="")
    db.add(spawner)  # type: ignore[attr-defined]
    forged = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=59)
    # what JupyterHub's ActivityAPIHandler does with the parsed body (jupyterhub/apihandlers/users.py)
    user.last_activity = forged
    spawner.last_activity = forged
    db.commit()  # type: ignore[attr-defined]
    db.expire_all()  # type: ignore[attr-defined]
    now = datetime.now(UTC).replace(tzinfo=None)
    for kept in (user.last_activity, spawner.last_activity):
        assert now - timedelta(seconds=5) <= kept <= now
    earlier = now - timedelta(minutes=20)
    spawner.last_activity = earlier
    assert spawner.last_activity == earlier  # the past is the past
