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


def test_latency_compares_the_policies_on_the_same_arrivals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "openb_node_list_gpu_node.csv", NODES)
    write(tmp_path, "openb_pod_list_default.csv", PODS)
    kept: list[bool] = []  # the test run's own malloc is left as it is
    monkeypatch.setattr(latency, "keep_freed_memory", lambda: kept.append(True) or True)
    assert latency.main(["--data", str(tmp_path), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    # Measured as the extender runs: glibc's malloc keeping freed memory (hub/malloc.py).
    assert kept == [True]
    assert "malloc: keeping freed memory (mallopt);" in out
    decisions = len(arrivals(read_tasks(tmp_path / "openb_pod_list_default.csv"), 3.0, 1))
    assert f"fgd decided as fgd-fresh on {decisions} of {decisions}" in out
    for policy in ("fgd-fresh", "fgd", "default"):
        assert f"| {policy} |" in out
    assert latency.main(["--data", str(tmp_path), "--seed", "1", "--glibc-default-malloc"]) == 0
    assert kept == [True]
    assert "malloc: glibc's defaults;" in capsys.readouterr().out


def test_first_breaks_names_the_tasks_that_took_a_free_node_of_a_size(tmp_path: Path) -> None:
    # Two 8-card nodes, 128 and 96 cores; an 8-card task of 120 cores fits only the first.
    nodes = read_nodes(
        write(
            tmp_path,
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nbig,128000,524288,8,G3\nsmall,96000,524288,8,G2\n",
        )
    )
    pods = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "wide,120000,8192,8,1000,,LS,Running,0,10,0\n"
    )
    tasks = read_tasks(write(tmp_path, "pods.csv", pods))
    broke = losses.first_breaks(nodes, tasks, "best-fit", 0, 128)
    assert broke == {"8 cards, 120 cores": 1}  # one arrival of 8 cards fills 8 of 16: it took the 128-core node
    assert losses.first_breaks(nodes, tasks, "best-fit", 0, 96) == {}


def test_empty_node_fragmentation_is_what_the_workload_cannot_use_on_each_kind(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "nodes.csv", NODES))  # 2 x T4 with 32 cores; 1 x V100M32 with 32 cores
    pods = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "t4,4000,8192,1,1000,T4,LS,Running,0,10,0\n"
        "any,4000,8192,1,1000,,LS,Running,0,10,0\n"
    )
    kinds = losses.empty_node_fragmentation(nodes, read_tasks(write(tmp_path, "pods.csv", pods)))
    # Half the workload is bound to T4: on the V100 node its one free card is a fragment for them.
    assert kinds == {"2 x T4, 32 cores": 0.0, "1 x V100M32, 32 cores": pytest.approx(0.5)}
