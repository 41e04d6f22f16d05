"""hub.homes and HomeCollector: each home's size against its limit, for the HomeOverSize alert."""

from pathlib import Path

from prometheus_client import CollectorRegistry

from hub.homes import HomeSizes, folder_bytes, homes
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
