"""Placements the hub decided whose pods the cluster's listing does not count yet (spawner.inventory.Pending)."""

from spawner.inventory import Allocation, Pending, add_pending
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
