"""The spawn form's choices, defaults and words (spawner/form.py), from literal inputs."""

import re
from types import SimpleNamespace

import pytest

from spawner.form import (
    FormChoice,
    form_gpu_value,
    in_form_words,
    render_spawn_form,
    split_gpu_choice,
    whole_gpus_allowed,
)
from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.quotas import GroupQuota, Usage, largest_slice
from spawner.shares import ShareError, parse_request

GiB = 2**30
MACHINE = simulated_gpus("2x16GiB:T4")


def _source(default_memory: str = "0") -> SimpleNamespace:
    images = [SimpleNamespace(slug="default", description="the hub's env"), SimpleNamespace(slug="np", description="x")]
    return SimpleNamespace(
        gpu_default_memory=default_memory,
        gpu_default_image="default",
        launchable_images=lambda: images,
        approved_models=lambda: [],
        selected_models=lambda: set(),
    )


def _form(
    groups: list[GroupQuota],
    previous: FormChoice | None = None,
    default_memory: str = "0",
    usage: Usage | None = None,
    startable_now: int | None = None,
) -> str:
    allowed = largest_slice(groups, Usage(), 16 * GiB)
    return render_spawn_form(
        _source(default_memory),  # type: ignore[arg-type]
        build_local(MACHINE),
        groups,
        usage or Usage(),
        allowed=allowed,
        startable_now=allowed if startable_now is None else startable_now,
        most_cards=whole_gpus_allowed(groups, 2, 16 * GiB),
        simulated=False,
        previous=previous,
    )


def _selected(form: str, name: str) -> str:
    select = re.search(rf'<select[^>]*name="{name}".*?</select>', form, re.S)
    assert select is not None, form
    chosen = re.findall(r'<option value="([^"]*)" selected>', select.group(0))
    assert len(chosen) == 1, select.group(0)
    return chosen[0]


def test_the_selects_look_like_selects() -> None:
    form = _form([])
    assert form.count('class="form-select"') == 2 and "form-control" not in form


def test_a_class_that_forbids_whole_gpus_offers_none() -> None:
    form = _form([GroupQuota("ml101", max_slice_bytes=4 * GiB, max_gpus=0)])
    assert "whole GPU" not in form and "gpus:" not in form
    assert '<option value="gpus:2">2 whole GPUs</option>' in _form([GroupQuota("staff")])


def test_the_default_is_the_class_slice_else_the_smallest_slice_never_cpu_only() -> None:
    assert _selected(_form([GroupQuota("ml101", max_slice_bytes=3 * GiB)]), "gpu") == "3GiB"
    assert _selected(_form([]), "gpu") == "512MiB"
    assert _selected(_form([], default_memory="2GiB"), "gpu") == "2GiB"


def test_the_form_shown_again_keeps_the_users_choices() -> None:
    previous = FormChoice(gpu="gpus:2", image="np")
    form = _form([], previous)
    assert _selected(form, "gpu") == "gpus:2" and _selected(form, "image") == "np"
    # A choice no longer offered falls back to the default rather than to nothing.
    limited = _form([GroupQuota("ml101", max_slice_bytes=4 * GiB, max_gpus=0)], previous)
    assert _selected(limited, "gpu") == "4GiB"


@pytest.mark.parametrize(
    ("gpu_memory", "gpus", "value"),
    [("4GiB", 0, "4GiB"), ("0", 2, "gpus:2"), ("0", 0, "0"), ("0.25", 0, "4GiB")],
)
def test_the_gpu_select_round_trips_the_spawn_options(gpu_memory: str, gpus: int, value: str) -> None:
    request = parse_request(gpu_memory, gpus, largest_card_bytes=16 * GiB, most_cards=4)
    assert form_gpu_value(request, 16 * GiB) == value
    back_memory, back_gpus = split_gpu_choice(value)
    back = parse_request(back_memory, back_gpus, largest_card_bytes=16 * GiB, most_cards=4)
    assert (back.kind, back.bytes_on(16 * GiB), back.gpus) == (request.kind, request.bytes_on(16 * GiB), request.gpus)


def test_refusals_use_the_forms_words() -> None:
    with pytest.raises(ShareError) as both:
        parse_request("4GiB", 1, largest_card_bytes=16 * GiB, most_cards=4)
    with pytest.raises(ShareError) as too_big:
        parse_request("64GiB", 0, largest_card_bytes=16 * GiB, most_cards=4)
    no_gpu = 'This machine has no GPU; ask for gpu_memory "0" (CPU only).'
    for api_words in (str(both.value), str(too_big.value), no_gpu):
        words = in_form_words(api_words)
        assert "gpu_memory" not in words and "gpus=" not in words, words
    assert in_form_words(no_gpu) == 'This machine has no GPU; choose "No GPU (CPU only)".'
    assert "1 whole GPU" in in_form_words(str(too_big.value))


def test_with_the_class_budget_full_the_class_slice_is_still_offered_and_chosen_and_start_waits() -> None:
    ml101 = GroupQuota("ml101", max_slice_bytes=4 * GiB, budget_bytes=8 * GiB)
    full = Usage(group_bytes={"ml101": 8 * GiB})
    form = _form([ml101], usage=full, startable_now=0)
    assert _selected(form, "gpu") == "4GiB"  # what the student came for, never CPU only by default
    assert '<option value="4GiB" selected>4 GiB of one GPU (busy now: Start joins the line)</option>' in form
    assert "Start puts you in line for it" in form
    assert "ml101: slices up to 4 GiB; the class&#39;s 8 GiB GPU budget is all in use now" in form
    free = _form([ml101], usage=Usage(group_bytes={"ml101": 4 * GiB}))
    assert "busy now" not in free and "Start puts you in line" not in free
    assert "4 GiB of the class&#39;s 8 GiB GPU budget free now" in free


def test_options_the_rules_can_never_grant_are_not_offered() -> None:
    """A class whose budget is 8 GiB can never hold a 16 GiB card, nor a slice above its largest."""
    form = _form([GroupQuota("ml101", max_slice_bytes=4 * GiB, budget_bytes=8 * GiB)])
    assert "whole GPU" not in form and "gpus:" not in form
    assert "8GiB" not in form and "16GiB" not in form
    assert whole_gpus_allowed([GroupQuota("lab", budget_bytes=32 * GiB)], 4, 16 * GiB) == 2
    assert whole_gpus_allowed([GroupQuota("lab", budget_bytes=32 * GiB), GroupQuota("staff")], 4, 16 * GiB) == 4
    assert '<option value="gpus:1">1 whole GPU</option>' in _form([GroupQuota("staff")])


def test_the_form_names_no_driver_error_when_its_gpus_are_simulated() -> None:
    form = render_spawn_form(
        _source(),  # type: ignore[arg-type]
        build_local(MACHINE),
        [],
        Usage(),
        allowed=16 * GiB,
        startable_now=16 * GiB,
        most_cards=2,
        simulated=True,
    )
    assert "simulated</strong>: this machine has no NVIDIA GPU." in form and "NVML" not in form


def test_refusals_in_the_form_say_choose_not_type_and_count_gpus_in_words() -> None:
    with pytest.raises(ShareError) as bad:
        parse_request("lots", 0, largest_card_bytes=16 * GiB, most_cards=4)
    words = in_form_words(str(bad.value))
    assert "type" not in words.lower() and words.endswith("Choose a size from the GPU list."), words
    assert in_form_words("ask for gpus=2") == "choose 2 whole GPUs"
    assert in_form_words("gpus=1 is too many") == "1 whole GPU is too many"
    assert "(s)" not in in_form_words("for whole cards with gpus=3")


@pytest.mark.parametrize(
    ("backend", "says", "never"),
    [
        ("local", "shared without memory isolation", "HAMi"),
        ("gpushare", "shared without memory isolation", "HAMi"),
        ("hami", "enforced by HAMi", "without memory isolation"),
        ("mig", "MIG instance", "without memory isolation"),
    ],
)
def test_the_form_says_how_a_slice_is_held_on_its_backend(backend: str, says: str, never: str) -> None:
    inventory = build_local(MACHINE)
    inventory.backend = backend
    form = render_spawn_form(
        _source(),  # type: ignore[arg-type]
        inventory,
        [],
        Usage(),
        allowed=16 * GiB,
        startable_now=16 * GiB,
        most_cards=2,
        simulated=False,
    )
    note = re.search(r'<p class="help-block gpuslice-slice-note">(.*?)</p>', form, re.S)
    assert note is not None, form
    assert says in note.group(1) and never not in note.group(1)
    assert "on this machine" not in form  # the same form serves a cluster


def test_a_form_that_offers_no_slice_says_nothing_of_slices() -> None:
    inventory = build_local(MACHINE)
    inventory.backend = "whole"
    form = render_spawn_form(
        _source(),  # type: ignore[arg-type]
        inventory,
        [],
        Usage(),
        allowed=16 * GiB,
        startable_now=16 * GiB,
        most_cards=2,
        simulated=False,
    )
    assert "gpuslice-slice-note" not in form
