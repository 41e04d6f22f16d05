from pathlib import Path

import pytest

from bench import latency, losses
from bench.placement import arrivals, read_nodes, read_tasks
from tests.bench.test_placement import NODES, PODS, write


def test_losses_account_for_every_failed_gpu(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "nodes.csv", NODES))
    tasks = read_tasks(write(tmp_path, "pods.csv", PODS))
    for seed in range(4):
        arrived = sum(t.gpu_demand for t in arrivals(tasks, 3.0, seed))
        unallocated, failed = losses.failures(nodes, tasks, "default", seed)
        failed_gpus = sum(v for k, v in failed.items() if k != "cpu")
        # What arrived either was placed or failed, by kind: nothing is counted twice or lost.
        assert (3.0 - unallocated) + failed_gpus == pytest.approx(arrived)


def test_latency_compares_the_policies_on_the_same_arrivals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "openb_node_list_gpu_node.csv", NODES)
    write(tmp_path, "openb_pod_list_default.csv", PODS)
    assert latency.main(["--data", str(tmp_path), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    decisions = len(arrivals(read_tasks(tmp_path / "openb_pod_list_default.csv"), 3.0, 1))
    assert f"fgd decided as fgd-fresh on {decisions} of {decisions}" in out
    for policy in ("fgd-fresh", "fgd", "default"):
        assert f"| {policy} |" in out
