from types import SimpleNamespace

from market.store import Model
from spawner.form import render_spawn_form
from spawner.gpus import simulated_gpus
from spawner.images import SpawnImage
from spawner.inventory import build_local
from spawner.quotas import GroupQuota, Usage, group_quota
from spawner.shares import slice_choices

GiB = 2**30


def test_group_rules_from_settings() -> None:
    quota = group_quota(
        {"name": "ml101", "max_slice": "4GiB", "budget": "40GiB", "servers_per_user": 1, "images": ["a"]}
    )
    assert quota == GroupQuota("ml101", 4 * GiB, None, 40 * GiB, 1, frozenset({"a"}))


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
