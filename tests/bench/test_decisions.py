from pathlib import Path

import pytest

from bench import decisions
from tests.bench.test_placement import NODES, PODS, write


def test_the_same_policy_decides_as_saved_and_another_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "openb_node_list_gpu_node.csv", NODES)
    write(tmp_path, "openb_pod_list_default.csv", PODS)
    saved = tmp_path / "before.json"
    common = ["--data", str(tmp_path), "--lists", "default", "--seeds", "3"]
    assert decisions.main([*common, "--policy", "best-fit", "--save", str(saved)]) == 0
    assert decisions.main([*common, "--policy", "best-fit", "--against", str(saved)]) == 0
    assert capsys.readouterr().out.count("| same |") == 3
    # Spread places the first slice on the other node: the first decision differs.
    assert decisions.main([*common, "--policy", "spread", "--against", str(saved)]) == 1
    assert "**differs from decision 0**" in capsys.readouterr().out


def test_first_difference_names_the_first_decision_that_differs() -> None:
    assert decisions.first_difference([[0, [1]], None], [[0, [1]], None]) is None
    assert decisions.first_difference([[0, [1]], None], [[0, [1]], [2, []]]) == 1
    assert decisions.first_difference([[0, [1]]], [[0, [1]], None]) == 1
