"""The class store (spawner/class_store.py): live changes, and what a start takes from the settings."""

from pathlib import Path

import pytest

from spawner.class_store import ClassStore
from spawner.quotas import GroupRulesError

GiB = 2**30
ML101 = {"name": "ml101", "members": ["ann", "bo"], "teachers": ["tina"], "max_slice": "4GiB", "budget": "2 slices"}


def test_a_class_changed_live_is_read_at_once_and_checked_first(tmp_path: Path) -> None:
    store = ClassStore(tmp_path / "classes.sqlite")
    store.seed([ML101])
    reader = ClassStore(tmp_path / "classes.sqlite")  # another process: the hub's spawners, the CLI
    store.change("ml101", lambda rules: {**(rules or {}), "members": ["ann", "bo", "cy"]})
    assert reader.get("ml101") == {**ML101, "members": ["ann", "bo", "cy"]}
    assert reader.groups()[0].quota.budget_bytes == 8 * GiB  # "2 slices" of its 4 GiB
    with pytest.raises(GroupRulesError, match="budget"):
        store.change("ml101", lambda rules: {**(rules or {}), "budget": "lots"})
    assert reader.get("ml101") == {**ML101, "members": ["ann", "bo", "cy"]}  # nothing written
    store.change("ml101", lambda rules: None)
    assert reader.classes() == ()


def test_a_start_takes_what_the_file_changed_and_keeps_what_was_changed_live(tmp_path: Path) -> None:
    store = ClassStore(tmp_path / "classes.sqlite")
    store.seed([ML101])
    store.change("ml101", lambda rules: {**(rules or {}), "members": ["ann", "bo", "cy"]})  # a teacher, live
    store.change("cv202", lambda rules: {"members": ["dee"]})  # a class made live
    store.seed([ML101])  # a restart, the file unchanged: the live edits stand
    assert store.get("ml101") == {**ML101, "members": ["ann", "bo", "cy"]}
    assert store.get("cv202") == {"name": "cv202", "members": ["dee"]}
    edited = {**ML101, "budget": "3 slices"}
    store.seed([edited])  # the file edited: its definition wins
    assert store.get("ml101") == edited
    store.seed([])  # the file no longer names it: gone; the live class stays
    assert [c["name"] for c in store.classes()] == ["cv202"]
