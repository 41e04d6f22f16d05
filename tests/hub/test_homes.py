"""hub.homes and HomeCollector: each home's size against its limit, for the HomeOverSize alert."""

from pathlib import Path
from types import SimpleNamespace

import jinja2
from prometheus_client import CollectorRegistry

from hub.homes import HomeSizes, folder_bytes, home_notice, homes, over_size_words
from hub.metrics import HomeCollector, register_allocations

MiB = 2**20


def test_a_home_is_the_blocks_its_files_take_and_links_are_not_followed(tmp_path: Path) -> None:
    home = tmp_path / "homes" / "ann"
    (home / "data").mkdir(parents=True)
    (home / "data" / "big").write_bytes(b"x" * 3 * MiB)
    (home / "sparse").open("wb").truncate(50 * MiB)  # a hole takes no blocks, as du counts
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"y" * 5 * MiB)
    (home / "link").symlink_to(outside)
    size = folder_bytes(home)
    assert 3 * MiB <= size < 4 * MiB
    assert homes("none", tmp_path / "homes") == {"ann": home}
    assert homes("none", tmp_path / "missing") == {}


def test_the_hub_serves_each_home_beside_its_limit(tmp_path: Path) -> None:
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "f").write_bytes(b"x" * MiB)
    sizes = HomeSizes(lambda: homes("none", tmp_path))
    assert sizes.sizes == {}  # nothing until the first walk
    sizes.refresh()
    registry = CollectorRegistry()
    register_allocations(HomeCollector(lambda: sizes.sizes, lambda user: 10 * MiB), registry)
    assert registry.get_sample_value("gpuslice_home_bytes", {"user": "ann"}) == float(sizes.sizes["ann"]) >= MiB
    assert registry.get_sample_value("gpuslice_home_limit_bytes", {"user": "ann"}) == 10 * MiB


def test_a_user_over_their_home_size_is_told_with_both_sizes_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "f").write_bytes(b"x" * 3 * MiB)
    (tmp_path / "bob").mkdir()
    sizes = HomeSizes(lambda: homes("none", tmp_path))
    notice = home_notice(sizes, lambda user: 2 * MiB)
    assert notice(SimpleNamespace(name="ann")) is None  # not walked yet: nothing is said
    sizes.refresh()
    words = notice(SimpleNamespace(name="ann"))
    assert words and "takes 3 MiB, over the 2 MiB" in words and "Delete" in words
    assert notice(SimpleNamespace(name="bob")) is None and notice(None) is None
    assert over_size_words(5, 0) is None  # no limit set: nothing to say


def test_the_hub_home_page_shows_the_home_warning_escaped() -> None:
    page = jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.FileSystemLoader(str(Path(__file__).parents[2] / "hub" / "templates")),
                jinja2.DictLoader({"templates/home.html": "{% block main %}HOME{% endblock main %}"}),
            ]
        ),
        autoescape=True,
    ).get_template("home.html")
    user = SimpleNamespace(all_spawners=lambda include_default: [])
    shown = page.render(user=user, gpuslice_home_notice="over <b>10 GiB</b>")
    assert "gpuslice-home-notice" in shown and "over &lt;b&gt;10 GiB&lt;/b&gt;" in shown and "HOME" in shown
    assert "gpuslice-home-notice" not in page.render(user=user, gpuslice_home_notice=None)


def test_a_home_made_after_the_last_walk_is_added_up_at_the_next_look(tmp_path: Path) -> None:
    (tmp_path / "ann").mkdir()
    sizes = HomeSizes(lambda: homes("none", tmp_path), interval_s=3600)
    sizes.refresh()
    (tmp_path / "ann" / "f").write_bytes(b"x" * MiB)
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "f").write_bytes(b"x" * MiB)
    latest = sizes.latest()
    assert latest["bob"] >= MiB  # new: walked now
    assert latest["ann"] < MiB  # known: its walk waits for the interval
