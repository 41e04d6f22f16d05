"""Placements the hub decided whose pods the cluster's listing does not count yet (spawner.inventory.Pending)."""

from spawner.inventory import ORPHAN_AFTER_S, Allocation, Pending, add_pending, live_pending
from spawner.kube import usage_from_pods
from spawner.shares import GiB
from spawner.sharing import build_kube
from spawner.sharing.gpushare import Gpushare
from tests.spawner.sharing.objects import node, pod

CARDS = [node("n1", {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "16"})]


def placed(name: str, card: int, gib: int, user: str = "ann", group: str | None = "ml101") -> Pending:
    return Pending(name, "n1", (card,), Allocation(user, "", gib * GiB, name), group, gib * GiB)


def test_a_pending_placement_takes_its_room_until_the_listing_counts_its_pod() -> None:
    inventory = build_kube(CARDS, [], Gpushare())
    assert add_pending(inventory, [placed("jupyter-ann", 1, 4)]) == []
    assert [g.free_bytes for g in inventory.nodes[0].gpus] == [8 * GiB, 4 * GiB]

    # Listed but not bound yet: the listing holds nothing for it, the placement still does.
    unbound = pod("jupyter-ann", "", {"aliyun.com/gpu-mem": "4"}, phase="Pending", user="ann")
    inventory = build_kube(CARDS, [unbound], Gpushare())
    assert add_pending(inventory, [placed("jupyter-ann", 1, 4)]) == []
    assert inventory.nodes[0].gpus[1].free_bytes == 4 * GiB

    # Bound (the scheduler put it on card 0, not the hub's choice): counted once, where it is.
    bound = pod(
        "jupyter-ann",
        "n1",
        {"aliyun.com/gpu-mem": "4"},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"},
        user="ann",
    )
    inventory = build_kube(CARDS, [bound], Gpushare())
    assert add_pending(inventory, [placed("jupyter-ann", 1, 4)]) == ["jupyter-ann"]
    assert [g.free_bytes for g in inventory.nodes[0].gpus] == [4 * GiB, 8 * GiB]


def test_a_jobs_placement_is_counted_once_its_pod_of_another_name_is() -> None:
    """A batch job's pod is named by the Job controller: the placement (named for its Job) is matched by user and
    server ("cy/job:7")."""
    held = Allocation("cy", "job:7", 8 * GiB, "gpuslice-job-7-1")
    job = Pending("gpuslice-job-7-1", "n1", (1,), held, "ml101", 8 * GiB)
    charged = {"gpuslice.io/group": "ml101", "gpuslice.io/gpu-memory-bytes": str(8 * GiB)}
    its_pod = pod(
        "gpuslice-job-7-1-x2k9d",
        "n1",
        {"aliyun.com/gpu-mem": "8"},
        {
            "hub.jupyter.org/servername": "job:7",
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "ALIYUN_COM_GPU_MEM_POD": "8",
            **charged,
        },
        user="cy",
    )
    inventory = build_kube(CARDS, [its_pod], Gpushare())
    assert add_pending(inventory, [job]) == ["gpuslice-job-7-1"]
    assert [g.free_bytes for g in inventory.nodes[0].gpus] == [8 * GiB, 0]
    usage = usage_from_pods([its_pod], "cy", "jupyter-cy", [job])
    assert usage.user_servers == 0  # a job is not a server
    assert usage.group_bytes == {"ml101": 8 * GiB}  # charged once, from its pod
    assert usage_from_pods([], "cy", "jupyter-cy", [job]).group_bytes == {"ml101": 8 * GiB}  # before it is listed


def test_a_placement_whose_pod_never_came_frees_its_room_after_a_while() -> None:
    """Its hub was killed between the placement and the pod: the room comes back (after ORPHAN_AFTER_S); a
    placement with its pod listed but not bound is still counted, however long it waits."""
    now = 10_000.0
    fresh, old = placed("jupyter-ann", 1, 4), placed("jupyter-bob", 0, 4, user="bob")
    fresh = Pending(**{**fresh.__dict__, "placed_at": now - 5})
    old = Pending(**{**old.__dict__, "placed_at": now - ORPHAN_AFTER_S - 1})
    assert live_pending([fresh, old], [], now) == [fresh]
    waiting = pod("jupyter-bob", "", {"aliyun.com/gpu-mem": "4"}, phase="Pending", user="bob")
    assert live_pending([fresh, old], [waiting], now) == [fresh, old]


def test_a_placement_on_a_node_that_is_gone_holds_nothing() -> None:
    inventory = build_kube(CARDS, [], Gpushare())
    gone = Pending("jupyter-bob", "n9", (0,), Allocation("bob", "", 4 * GiB, "jupyter-bob"))
    assert add_pending(inventory, [gone]) == []
    assert inventory.allocated_bytes == 0


def test_pending_placements_count_against_the_group_budget_until_their_pods_are_listed() -> None:
    listed = pod("jupyter-cy", "n1", {"aliyun.com/gpu-mem": "2"}, {"gpuslice.io/group": "ml101"}, user="cy")
    listed["metadata"]["annotations"]["gpuslice.io/gpu-memory-bytes"] = str(2 * GiB)
    pending = [placed("jupyter-ann", 0, 4), placed("jupyter-cy", 1, 2, user="cy")]  # cy's pod is listed now
    usage = usage_from_pods([listed], "ann", "jupyter-dee", pending)
    assert usage.group_bytes == {"ml101": 6 * GiB}
    assert usage.user_servers == 1  # ann's pending server
