"""Catalog validation: bad entries are reported with file, entry and field, and skipped."""

from pathlib import Path

from market.catalog import load_images, load_models

REPO = Path(__file__).parents[2]


def test_the_shipped_catalogs_are_valid() -> None:
    images = load_images(REPO / "images" / "catalog.yaml")
    models = load_models(REPO / "images" / "models.yaml")
    assert images.problems == () and models.problems == ()
    assert {i.framework for i in images.images} >= {"pytorch", "tensorflow", "jax"}
    assert any(m.package for m in models.models), "the demo catalog needs a model a PyPI package ships"


def test_a_bad_entry_is_skipped_and_named_the_rest_loads(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(
        """
images:
  - {id: good, name: Good, version: "1", framework: jax, size: 4GiB}
  - {id: Bad Id, name: X, version: "1", framework: jax}
  - {id: typo, name: X, version: "1", framework: pytorch, sise: 4GiB}
  - {id: size, name: X, version: "1", framework: pytorch, size: lots}
  - {id: cuda, name: X, version: "1", framework: mxnet, cuda: "twelve"}
  - just text
  - {id: good, name: Again, version: "2", framework: jax}
"""
    )
    catalog = load_images(path)
    assert [i.id for i in catalog.images] == ["good"]
    assert catalog.images[0].size_bytes == 4 * 2**30
    problems = [(p.entry, p.field) for p in catalog.problems]
    assert problems == [
        ("entry 2 (Bad Id)", "id"),
        ("entry 3 (typo)", "sise"),
        ("entry 4 (size)", "size"),
        ("entry 5 (cuda)", "framework"),
        ("entry 5 (cuda)", "cuda"),
        ("entry 6", "-"),
        ("entry 7 (good)", "id"),
    ]
    text = str(catalog.problems[2])
    assert text.startswith(f"{path}: entry 4 (size): size: ") and text.endswith("the entry was skipped")


def test_broken_yaml_or_shape_is_one_problem_not_a_crash(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("images: [\n")
    assert "not valid YAML" in load_images(broken).problems[0].message
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("models: {a: 1}\n")
    assert "list under 'models:'" in load_models(wrong).problems[0].message
    assert "cannot read it" in load_images(tmp_path / "missing.yaml").problems[0].message


def test_model_paths_cannot_leave_the_models_root(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    common = 'name: M, version: "1", task: t, framework: f, license: MIT'
    path.write_text(
        f"""
models:
  - {{id: up, {common}, path: ../etc}}
  - {{id: abs, {common}, path: /etc}}
  - {{id: both, {common}, path: a, package: {{module: m, attribute: a, filename: f}}}}
  - {{id: none, {common}}}
  - {{id: ok, {common}, path: team/bert}}
"""
    )
    catalog = load_models(path)
    assert [m.id for m in catalog.models] == ["ok"]
    assert [p.entry for p in catalog.problems] == ["entry 1 (up)", "entry 2 (abs)", "entry 3 (both)", "entry 4 (none)"]
    assert "without '..'" in catalog.problems[0].message


def test_each_models_sample_output_matches_its_comment(tmp_path: Path) -> None:
    """The load snippet's last line promises an output in a comment: run it and compare."""
    from market.files import unpack_package_model

    for entry in load_models(REPO / "images" / "models.yaml").models:
        _, _, promise = entry.load.strip().rpartition("\n")[2].partition("  # ")
        if not promise or entry.package is None:
            continue
        folder = unpack_package_model(tmp_path, entry.id, entry.package)
        lines = entry.load.replace("{path}", f"Path({str(folder)!r})").strip().split("\n")
        scope: dict[str, object] = {}
        exec("from pathlib import Path\n" + "\n".join(lines[:-1]), scope)  # our own seed's code
        result = repr(eval(lines[-1].partition("  # ")[0], scope))
        assert result.startswith(promise.partition("...")[0]), (entry.id, result, promise)
