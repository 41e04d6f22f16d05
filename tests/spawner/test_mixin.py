import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from traitlets import TraitError

from market.store import Model
from spawner.form import render_spawn_form
from spawner.gpus import simulated_gpus
from spawner.images import SpawnImage
from spawner.inventory import build_local
from spawner.ledger import Ledger
from spawner.lifecycle import LedgerGpuMixin
from spawner.quotas import GroupQuota, Usage, read_groups
from spawner.request import GpuRefused
from spawner.shares import slice_choices

GiB = 2**30


def test_group_rules_from_settings() -> None:
    (rules,) = read_groups(
        [{"name": "ml101", "max_slice": "4GiB", "budget": "40GiB", "servers_per_user": 1, "images": ["a"]}]
    )
    assert rules.quota == GroupQuota("ml101", 4 * GiB, None, 40 * GiB, 1, frozenset({"a"}))


def test_slice_choices_stop_at_the_ceiling() -> None:
    assert slice_choices(6 * GiB) == [GiB // 2, GiB, 2 * GiB, 4 * GiB, 6 * GiB]
    assert slice_choices(0) == []


def test_form_escapes_what_admins_and_users_wrote() -> None:
    images = [
        SpawnImage("default", "<script>alert(1)</script>", "/env"),
        SpawnImage('x"><b>', "d", "/env"),
    ]
    models = [Model("langid-97", "<b>langid</b>", "1", "language id", "numpy", "BSD", "langid-97")]
    spawner = SimpleNamespace(
        gpu_default_memory="0",
        gpu_default_image="default",
        launchable_images=lambda: images,
        approved_models=lambda: models,
        selected_models=lambda: {"langid-97"},
    )
    gpus = simulated_gpus("1x16GiB:<i>T4</i>")
    form = render_spawn_form(
        spawner,  # type: ignore[arg-type]
        build_local(gpus),
        [GroupQuota("<img src=x>", max_slice_bytes=4 * GiB)],
        Usage(),
        allowed=4 * GiB,
        startable_now=4 * GiB,
        most_cards=1,
        simulated=True,
    )
    assert "<script>" not in form and "&lt;script&gt;" in form
    assert "<img" not in form and "<i>T4" not in form and 'x"><b>' not in form
    assert '<option value="4GiB" selected>4 GiB of one GPU</option>' in form
    assert "(simulated)" in form and "this machine has no NVIDIA GPU" in form
    assert '<option value="gpus:1">1 whole GPU</option>' in form
    assert '<input type="checkbox" name="models" value="langid-97" checked> &lt;b&gt;langid' in form


class _HubSpawner:
    """What the mixin uses of JupyterHub's Spawner here."""

    start_timeout = 300

    def run_pre_spawn_hook(self) -> None:
        return None


class LocalSpawner(LedgerGpuMixin, _HubSpawner):
    def __init__(self, ledger: Path, user: str, groups: list[str], name: str = "", **options: Any) -> None:
        super().__init__(gpu_simulate="2x16GiB:T4,1x80GiB:H100", gpu_ledger_path=str(ledger), gpu_groups=RULES)
        self.user = SimpleNamespace(name=user, groups=[SimpleNamespace(name=g) for g in groups], admin=False)
        self.name = name
        self.user_options = options
        self.log = logging.getLogger("test")


RULES = [{"name": "ml101", "max_slice": "8GiB", "max_gpus": 1, "budget": "100GiB"}]


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"gpus": 1}, "Group 'default' allows no whole GPUs per server; you asked for 1."),
        ({"gpu_memory": "16GiB"}, "Group 'default' allows slices up to 4 GiB; you asked for 16 GiB."),
        ({"gpu_memory": "1"}, "Group 'default' allows no whole GPUs"),  # a whole card as a share
    ],
)
def test_a_user_in_no_group_gets_the_default_rules_not_whole_cards(
    tmp_path: Path, options: dict[str, Any], refusal: str
) -> None:
    """The second account of issue 29: no class, so no whole cards and no big slice, and nothing held."""
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(GpuRefused) as refused:
        LocalSpawner(ledger, "kim2", [], **options).allocate()
    assert refused.value.status_code == 403 and refusal in str(refused.value)
    assert Ledger(ledger).holdings() == []  # a refused spawn leaves no allocation
    _, holds = LocalSpawner(ledger, "kim2", [], gpu_memory="4GiB").allocate()  # the default's slice fits
    assert holds is not None and [h.group for h in holds] == ["default"]
    with pytest.raises(GpuRefused, match="allows 1 running server"):  # and one server at a time
        LocalSpawner(ledger, "kim2", [], name="second", gpu_memory="1GiB").allocate()
    _, holds = LocalSpawner(ledger, "ann", ["ml101"], gpus=1).allocate()  # the class's own rules still hold
    assert holds is not None and [h.group for h in holds] == ["ml101"]


def test_bad_group_rules_in_the_config_stop_the_spawner_naming_the_group() -> None:
    with pytest.raises(TraitError, match=r"gpu_groups: groups\.ml101\.max_slice: 'big' is not an amount"):
        LedgerGpuMixin(gpu_groups=[{"name": "ml101", "max_slice": "big"}])


def test_a_class_added_to_the_store_holds_at_the_next_spawn_and_the_configured_default_stays(tmp_path: Path) -> None:
    """The class store (spawner/class_store.py) is read at every spawn: a member added live, in no hub group
    yet, gets the class's rules; the settings' default rules stay for everyone else."""
    from spawner.class_store import ClassStore

    store = ClassStore(tmp_path / "classes.sqlite")
    ledger = tmp_path / "ledger.sqlite"
    spawner = LocalSpawner(ledger, "dee", [], gpu_memory="8GiB")
    spawner.gpu_groups = [*RULES, {"name": "default", "max_slice": "2GiB"}]
    spawner.gpu_classes_path = str(store.path)
    store.seed(read_groups(spawner.gpu_groups))
    with pytest.raises(GpuRefused, match="Group 'default' allows slices up to 2 GiB"):
        spawner.allocate()
    store.change("ml101", lambda rules: {**(rules or {}), "members": ["dee"]})  # the teacher adds dee
    assert [g.name for g in spawner.gpu_group_rules] == ["ml101", "default"]
    _, holds = spawner.allocate()
    assert holds is not None and [h.group for h in holds] == ["ml101"]
