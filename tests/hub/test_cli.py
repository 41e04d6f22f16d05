import json
import subprocess
import sys
from pathlib import Path

import pytest

from hub.cli import main
from tests.bench.test_placement import NODES, PODS
from tests.shared import shared_file


def write_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_bench_placement_prints_the_fixed_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    argv = ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "2", "--json"]
    assert main([*argv, "--policy", "best-fit", "--policy", "default"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["capacity_gpus"] == 3.0
    assert list(out["policies"]) == ["best-fit", "default"]
    assert 0 < out["policies"]["default"]["gpu_allocation_ratio"] <= 1


def test_bench_placement_replays_live_by_default_and_adds_the_limit_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    argv = ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--policy", "default", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["knowledge"] == "live"
    assert main([*argv, "--oracle", "--bound"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["knowledge"] == "oracle"
    limit, default = out["limit"], out["policies"]["default"]
    assert 0 <= limit["relaxation_unallocated_gpus"] <= limit["hindsight_unallocated_gpus"] <= out["capacity_gpus"]
    assert default["unallocated_gpus"] >= limit["relaxation_unallocated_gpus"] - 1e-9
    assert set(default) >= {"gpu_allocation_ratio", "unallocated_gpus", "failed_tasks", "decision_us_p99"}


def test_bench_placement_runs_every_policy_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    assert main(["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"random-fit", "best-fit", "spread", "dot-product", "fgd", "default"}


def test_bench_placement_reports_malformed_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    pods.write_text(PODS + "bad,1,1,1,x,,LS,Running,0,1,0\n")
    assert main(["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--json"]) == 2
    assert f"{pods}:7: gpu_milli must be a whole number" in capsys.readouterr().err


def test_bench_refuses_zero_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    assert main(["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "0"]) == 2
    assert "--seeds must be at least 1" in capsys.readouterr().err


def test_up_refuses_bad_settings_before_starting_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"port: 0\ndata_dir: {tmp_path / 'data'}\n")
    assert main(["up", "--config", str(bad)]) == 2
    assert "port must be a number from 1 to 65535" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


@pytest.mark.process
@pytest.mark.slow
def test_the_installed_command_replays_the_real_trace(tmp_path: Path) -> None:
    """The console script, end to end, on the real node list and a slice of a real pod list."""
    data = shared_file("data/alibaba-gpu-v2023")
    pods = tmp_path / "pods.csv"
    lines = (data / "openb_pod_list_gpushare40.csv").read_text().splitlines()
    pods.write_text("\n".join(lines[:1500]) + "\n")
    exe = Path(sys.executable).with_name("gpuslice")
    result = subprocess.run(
        [
            str(exe),
            "bench",
            "placement",
            "--nodes",
            str(data / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(pods),
            "--policy",
            "best-fit",
            "--policy",
            "default",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    out = json.loads(result.stdout)
    assert out["capacity_gpus"] == 6212.0
    best_fit, default = out["policies"]["best-fit"], out["policies"]["default"]
    # The property the benchmark exists to show, on real data: default strands less GPU.
    assert default["unallocated_gpus"] < best_fit["unallocated_gpus"]


def test_bench_without_the_bench_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the extra were not installed: importing psutil fails as Python does then.
    missing = "psutil"
    monkeypatch.setitem(sys.modules, missing, None)
    for module in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(SystemExit) as stop:
        main(["bench", "class", "--users", "1"])
    assert f"{missing} is missing" in str(stop.value) and "pip install -e '.[bench]'" in str(stop.value)


@pytest.mark.process
def test_usage_report_says_which_prometheus_did_not_answer(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.e2e.platform import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["usage", "--prometheus", url, "--weeks", "1"]) == 1
    assert f"Prometheus at {url} did not answer (ConnectionError); is gpuslice up running?" in capsys.readouterr().err
