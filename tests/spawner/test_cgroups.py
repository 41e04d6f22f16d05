"""spawner.cgroups (pure): a server's limits, its device rules, and each confining layout's values."""

import pytest

from spawner.cgroups import (
    BASE_DEVICES,
    DEFAULT_LIMITS,
    DeviceNode,
    Limits,
    LimitsError,
    cgroup_name,
    cpu_shares,
    device_rules,
    limits_for,
    nvidia_card,
    parse_limits,
    parse_settings_limits,
    systemd_properties,
    v1_files,
    v2_files,
)

GiB, MiB = 2**30, 2**20
NODES = [
    DeviceNode("/dev/nvidia0", 195, 0, 0),
    DeviceNode("/dev/nvidia1", 195, 1, 1),
    DeviceNode("/dev/nvidiactl", 195, 255),
    DeviceNode("/dev/nvidia-uvm", 510, 0),
]


def test_the_defaults_and_the_settings_spelling() -> None:
    assert Limits(4 * GiB, 512, 100, GiB, GiB, 10 * GiB) == DEFAULT_LIMITS
    raw = {"memory": "2GiB", "processes": 256, "cpu_weight": 50, "tmp": "512MiB", "shm": "64MiB", "home": "5GiB"}
    assert parse_limits(raw) == Limits(2 * GiB, 256, 50, 512 * MiB, 64 * MiB, 5 * GiB)
    assert parse_limits({"memory": "8GiB"}) == Limits(memory_bytes=8 * GiB)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"memroy": "2GiB"}, "unknown key(s) memroy (did you mean memory?); use memory, processes"),
        ({"memory": "lots"}, "limits.memory: 'lots' is not an amount of memory"),
        ({"memory": "1MiB"}, "limits.memory: 1MiB is too small; at least 256 MiB"),
        ({"memory": "1e400"}, "more memory than any machine has"),
        ({"processes": 3}, "limits.processes: must be a whole number from 16 to 1000000, not 3"),
        ({"processes": True}, "limits.processes: must be a whole number"),
        ({"cpu_weight": "high"}, "limits.cpu_weight: must be a whole number from 1 to 10000, not 'high'"),
    ],
)
def test_bad_limits_say_what_to_write(raw: dict[str, object], message: str) -> None:
    with pytest.raises(LimitsError) as caught:
        parse_limits(raw)
    assert message in str(caught.value)


def test_a_class_limits_go_over_the_settings() -> None:
    raw = {"memory": "8GiB", "processes": 1024, "classes": {"ml101": {"memory": "2GiB"}, "ml102": {"tmp": "2GiB"}}}
    machine, classes = parse_settings_limits(raw)
    assert machine == Limits(8 * GiB, 1024)
    assert classes == {"ml101": Limits(2 * GiB, 1024), "ml102": Limits(8 * GiB, 1024, tmp_bytes=2 * GiB)}
    assert limits_for(raw, []) == machine
    assert limits_for(raw, ["other", "ml102", "ml101"]) == classes["ml102"]  # the first class with its own
    with pytest.raises(LimitsError, match=r"limits\.classes\.ml101\.processes: must be a whole number"):
        parse_settings_limits({"classes": {"ml101": {"processes": 0}}})
    with pytest.raises(LimitsError, match=r"limits\.classes\.ml101 must be a mapping"):
        parse_settings_limits({"classes": {"ml101": "small"}})
    with pytest.raises(LimitsError, match=r"unknown key\(s\) clases \(did you mean classes\?\)"):
        parse_settings_limits({"clases": {}})


def test_a_server_may_open_its_own_cards_and_no_other() -> None:
    assert nvidia_card("nvidia12") == 12 and nvidia_card("nvidiactl") is None and nvidia_card("nvidia-uvm") is None
    assert device_rules(NODES, {1}) == [*BASE_DEVICES, "c 195:1 rw", "c 195:255 rw", "c 510:0 rw"]
    assert device_rules(NODES, {0, 1}) == [*BASE_DEVICES, "c 195:0 rw", "c 195:1 rw", "c 195:255 rw", "c 510:0 rw"]
    assert device_rules(NODES, set()) == list(BASE_DEVICES)  # CPU only: no NVIDIA node at all


def test_cgroup_v1_files_close_the_device_list_first() -> None:
    files = v1_files(Limits(2 * GiB, 64, 200, MiB, MiB), ["c 1:3 rwm"])
    assert files == {
        "memory": [("memory.limit_in_bytes", str(2 * GiB))],
        "pids": [("pids.max", "64")],
        "cpu": [("cpu.shares", "2048")],
        "devices": [("devices.deny", "a"), ("devices.allow", "c 1:3 rwm")],
    }
    assert cpu_shares(100) == 1024 and cpu_shares(1) == 10


def test_cgroup_v2_files_and_systemd_properties() -> None:
    assert v2_files(Limits(2 * GiB, 64, 200, MiB, MiB)) == [
        ("memory.max", str(2 * GiB)),
        ("memory.swap.max", "0"),
        ("pids.max", "64"),
        ("cpu.weight", "200"),
    ]
    assert systemd_properties(Limits(2 * GiB, 64, 200, MiB, MiB), NODES, {0}) == [
        f"MemoryMax={2 * GiB}",
        "MemorySwapMax=0",
        "TasksMax=64",
        "CPUWeight=200",
        "DevicePolicy=closed",
        "DeviceAllow=char-pts rw",
        "DeviceAllow=/dev/ptmx rw",
        "DeviceAllow=/dev/nvidia0 rw",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
    ]


def test_cgroup_names_are_safe_and_distinct() -> None:
    assert cgroup_name("ann/", 1.5) == "gpuslice-ann-1500"
    assert cgroup_name("ann/gpu", 2.0) == "gpuslice-ann-gpu-2000"
    assert cgroup_name("a-b@x/../y", 2.0) == "gpuslice-a_2db_40x-.._2fy-2000"
