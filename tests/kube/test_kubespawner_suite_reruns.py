"""Which of the suite's failures are run once more: read from a JUnit report as the suite writes it."""

from __future__ import annotations

from pathlib import Path

from tests.kube.kubespawner_suite import read_junit, to_run_again

CASE = '<testcase classname="tests.test_spawner" name="{name}">{inner}</testcase>'
SLOW = '<failure message="kubernetes_asyncio.stream.ws_client.ExecError: def check_up(url):">x</failure>'
LEFTOVER = '<failure message="assert False&#10; +  where False = isinstance(None, int)">x</failure>'


def report(tmp_path: Path, cases: list[tuple[str, str]]) -> Path:
    body = "".join(CASE.format(name=name, inner=inner) for name, inner in cases)
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_a_slow_server_and_every_failure_after_it_run_again_but_not_one_before(tmp_path: Path) -> None:
    result = read_junit(
        report(
            tmp_path,
            [
                ("test_before", LEFTOVER),
                ("test_ok", ""),
                ("test_spawn_start_restore_pod_name", SLOW),
                ("test_between", ""),
                ("test_spawn_start_profile_list_override_namespace", LEFTOVER),
            ],
        )
    )
    assert result.failed["test_spawner::test_spawn_start_profile_list_override_namespace"] == "assert False"
    assert to_run_again(result) == [
        "test_spawner::test_spawn_start_restore_pod_name",
        "test_spawner::test_spawn_start_profile_list_override_namespace",
    ]


def test_without_a_slow_server_nothing_runs_again(tmp_path: Path) -> None:
    result = read_junit(report(tmp_path, [("test_a", LEFTOVER), ("test_b", "")]))
    assert to_run_again(result) == []
