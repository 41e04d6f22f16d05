"""The Images and Models pages with AppTest over a real, seeded market store."""

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from market import seeding
from market.store import Image, Model, Store
from portal.data import markets
from portal.identity import Identity
from portal.sources import classes, clients, servers
from portal.sources import markets as market_data
from spawner.quotas import read_groups
from tests.portal.test_pages import fakes, run  # noqa: F401  (fixture)

pytestmark = pytest.mark.pages  # Streamlit pages run by AppTest: not in the fast tier

REPO = Path(__file__).parents[2]


class RecordingHub:
    """Stands in for the hub's REST API: records the launch and answers as the hub does."""

    def __init__(self, status: int = 202, message: str = "") -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.status, self.message = status, message

    def post(self, path: str, body: dict[str, Any]) -> Any:
        self.posts.append((path, body))
        outer = self

        class Response:
            status_code = outer.status
            text = outer.message

            def json(self) -> dict[str, Any]:
                return {"status": outer.status, "message": outer.message}

        return Response()


@pytest.fixture
def market(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fakes: dict[str, object]) -> Iterator[Store]:  # noqa: F811
    store = Store(f"sqlite:///{tmp_path / 'market.sqlite'}")
    store.migrate()
    seeding.seed(store, REPO / "images" / "catalog.yaml", REPO / "images" / "models.yaml", tmp_path / "models")
    for slug in ("pytorch", "jax"):  # "installed" here: they run from the platform's environment
        store.save_image(replace(store.image(slug), local_path="@platform"), actor="root")  # type: ignore[type-var]
    hub = RecordingHub()
    monkeypatch.setattr(market_data, "market", lambda: store)
    monkeypatch.setattr(market_data, "models_root", lambda: tmp_path / "models")
    monkeypatch.setattr(servers, "image_usage", lambda: {"default": 3})
    # The portal's service token may not start servers (the real hub answers 403): a launch
    # goes through the reader's own client (issue 13).
    monkeypatch.setattr(clients, "hub_client", lambda: RecordingHub(403, "the portal service may not start servers"))
    monkeypatch.setattr(clients, "acting_client", lambda identity: hub)
    monkeypatch.setattr(
        classes, "group_rules", lambda: read_groups([{"name": "ml101", "max_slice": "4GiB", "members": ["ann"]}])
    )
    monkeypatch.setattr(classes, "teaches", lambda identity: identity.admin)
    monkeypatch.setattr(classes, "my_groups", lambda identity: {"ml101"} if identity.name == "ann" else set())
    store.hub = hub  # type: ignore[attr-defined]
    yield store


def markdown(at: Any) -> str:
    return "\n".join(str(m.value) for m in at.markdown) + "\n".join(str(c.value) for c in at.caption)


def test_images_browse_filter_and_launch(market: Store, fakes: dict[str, object]) -> None:  # noqa: F811
    fakes["identity"] = Identity("dana")
    at = run("screens/images.py")
    text = markdown(at)
    for name in ("PyTorch 2\\.5", "TensorFlow 2\\.18", "JAX 0\\.4", "Python \\(platform environment\\)"):
        assert name in text
    assert "3 server\\(s\\) running it" in text
    assert "Not installed on this machine" in text and "launch-tensorflow" not in [b.key for b in at.button]
    at.text_input[0].input("torchvision").run()
    assert [b.key for b in at.button] == ["launch-pytorch"]
    at.text_input[0].input("").run()
    at.multiselect[0].select("jax").run()
    assert [b.key for b in at.button] == ["launch-jax"]
    at.multiselect[0].unselect("jax").run()
    assert at.selectbox[0].label == "GPU for the server you launch" and at.selectbox[0].value == "512MiB"
    at.selectbox[0].select("2GiB").run()
    next(b for b in at.button if b.key == "launch-default").click().run()
    posted = {"image": "default", "gpu_memory": "2GiB"}
    assert market.hub.posts == [("/users/dana/server", posted)]  # type: ignore[attr-defined]
    success = "Starting your server with Python (platform environment) and 2 GiB of one GPU."
    assert success in [s.value for s in at.success]
    assert "[Open your server](/user/dana/)" in markdown(at)


def test_launching_offers_the_class_slice_and_says_cpu_only_plainly(market: Store, fakes: dict[str, object]) -> None:  # noqa: F811
    fakes["identity"] = Identity("ann")
    at = run("screens/images.py")
    assert at.selectbox[0].value == "4GiB" and at.selectbox[0].options[-1] == "4 GiB of one GPU"
    at.selectbox[0].select("0").run()
    next(b for b in at.button if b.key == "launch-default").click().run()
    assert market.hub.posts[-1] == ("/users/ann/server", {"image": "default", "gpu_memory": "0"})  # type: ignore[attr-defined]
    assert "Starting your server with Python (platform environment) and no GPU (CPU only)." in [
        s.value for s in at.success
    ]


def test_a_hub_refusal_is_shown_and_group_images_are_explained(
    market: Store,
    fakes: dict[str, object],  # noqa: F811
) -> None:
    market.hub.status, market.hub.message = 409, "Nothing can hold 4 GiB of one GPU right now."  # type: ignore[attr-defined]
    market.save_image(Image("cuda-lab", "CUDA lab", "1", "python", groups=("gpu-course",)), actor="root")
    fakes["identity"] = Identity("dana")
    at = run("screens/images.py")
    assert "Only for the groups gpu-course" in markdown(at)
    assert "launch-cuda-lab" not in [b.key for b in at.button]
    next(b for b in at.button if b.key == "launch-default").click().run()
    assert [e.value for e in at.error] == ["Nothing can hold 4 GiB of one GPU right now."]


def test_user_text_is_escaped(market: Store, fakes: dict[str, object]) -> None:  # noqa: F811
    evil = Image("evil", "<img src=x onerror=alert(1)> **bold**", "1", "python", description="[click](javascript:x)")
    market.save_image(evil, actor="root")
    at = run("screens/images.py")
    text = markdown(at)
    assert "\\<img src=x onerror=alert\\(1\\)\\> \\*\\*bold\\*\\*" in text
    assert "\\[click\\]\\(javascript\\:x\\)" in text


def test_admins_deprecate_and_publish_with_validation(market: Store, fakes: dict[str, object]) -> None:  # noqa: F811
    at = run("screens/images.py")
    next(b for b in at.button if b.key == "status-jax").click().run()
    assert market.image("jax").status == "deprecated"  # type: ignore[union-attr]
    assert "launch-jax" not in [b.key for b in at.button]  # admins still see it, to restore it
    assert "status-jax" in [b.key for b in at.button]

    form_inputs = {t.label: t for t in at.text_input}
    form_inputs["Id"].input("Not A Slug")
    form_inputs["Name"].input("RAPIDS")
    form_inputs["Version"].input("24.10")
    next(b for b in at.button if b.label == "Publish").click().run()
    errors = [e.value for e in at.error]  # in the form's words, no validator jargon
    assert (
        "Id: use lower-case letters, digits and '-', starting with a letter or digit (for example my-model-2)."
        in errors
    )
    assert "Framework: choose one of pytorch, tensorflow, jax or python." in errors  # never silently the first
    assert not any("String should match" in e or "pattern" in e for e in errors)
    assert market.image("Not A Slug") is None

    form_inputs = {t.label: t for t in at.text_input}
    form_inputs["Id"].input("rapids")
    form_inputs["Tags (comma-separated)"].input("dataframes, gpu")
    next(s for s in at.selectbox if s.label == "Framework").select("python")
    next(b for b in at.button if b.label == "Publish").click().run()
    assert market.image("rapids").tags == ("dataframes", "gpu")  # type: ignore[union-attr]
    assert market.image("rapids").framework == "python"  # type: ignore[union-attr]
    assert "Image rapids published." in [s.value for s in at.success]
    assert "status-rapids" in [b.key for b in at.button]  # the new card, without a reload


def test_models_use_in_notebook_and_propose(market: Store, fakes: dict[str, object], tmp_path: Path) -> None:  # noqa: F811
    fakes["identity"] = Identity("dana")
    at = run("screens/models.py")
    assert "langid\\.py language identifier" in markdown(at)
    at.toggle[0].set_value(True).run()
    assert market.selected_models("dana") == ["langid-97"]
    assert 'Path(os.environ["GPUSLICE_MODELS_DIR"]) / "langid-97"' in at.code[0].value

    (tmp_path / "models" / "bert-tiny").mkdir()
    (tmp_path / "models" / "bert-tiny" / "model.bin").write_bytes(b"w")
    form = {t.label: t for t in at.text_input}
    values = {"Id": "bert-tiny", "Name": "BERT tiny", "Version": "1", "Task": "fill-mask", "Framework": "pytorch"}
    for label, value in values.items():
        form[label].input(value)
    form["License"].input("Apache-2.0")
    form["Folder under the models root"].input("../../etc")
    next(b for b in at.button if b.label == "Propose").click().run()
    assert any("without '..'" in e.value for e in at.error)
    form = {t.label: t for t in at.text_input}
    form["Folder under the models root"].input("bert-tiny")
    next(b for b in at.button if b.label == "Propose").click().run()
    assert "Proposed bert-tiny; an admin will review it." in [s.value for s in at.success]
    assert market.model("bert-tiny").status == "pending"  # type: ignore[union-attr]
    at.run()
    assert "Pending: proposed by dana" in "\n".join(w.value for w in at.warning).replace("\\", "")

    fakes["identity"] = Identity("root", admin=True)
    at = run("screens/models.py")
    next(b for b in at.button if b.key == "approve-bert-tiny").click().run()
    assert market.model("bert-tiny").status == "approved"  # type: ignore[union-attr]


def test_a_rejected_proposal_names_who_rejected_it(market: Store, fakes: dict[str, object], tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "models" / "big").mkdir()
    proposal = Model("big", "Big", "1", "fill-mask", "pytorch", "MIT", "big", description="Runs `big.load()` fast.")
    market.propose_model(proposal, actor="carol")
    fakes["identity"] = Identity("root", admin=True)
    at = run("screens/models.py")
    next(t for t in at.text_input if t.key == "note-big").input("too large for our cards")
    next(b for b in at.button if b.key == "reject-big").click().run()
    fakes["identity"] = Identity("carol")
    at = run("screens/models.py")
    warnings = "\n".join(w.value for w in at.warning).replace("\\", "")
    assert "Rejected by root: too large for our cards (proposed by carol)" in warnings
    assert "`big.load()`" in markdown(at)  # a code span, not escaped literal backticks


def test_market_writes_are_authorized_on_the_server_side(market: Store, tmp_path: Path) -> None:
    user = Identity("dana")
    with pytest.raises(PermissionError, match="only admins can publish"):
        markets.publish_image(market, user, Image("x", "X", "1", "python"))
    with pytest.raises(PermissionError, match="only admins can deprecate"):
        markets.set_image_status(market, user, "pytorch", "deprecated")
    with pytest.raises(PermissionError, match="only admins can approve"):
        markets.review_model(market, user, "langid-97", approve=False)
    root = tmp_path / "models"
    (root / "m").mkdir()
    from market.store import Model

    for n in range(3):
        markets.propose_model(market, user, Model(f"m{n}", "M", "1", "t", "f", "MIT", "m"), root, per_hour=3)
    with pytest.raises(markets.MarketRefusedError, match="limit is 3"):
        markets.propose_model(market, user, Model("m9", "M", "1", "t", "f", "MIT", "m"), root, per_hour=3)
    with pytest.raises(markets.MarketRefusedError, match="not approved"):
        markets.use_model(market, user, "m0")
    assert [m.slug for m in markets.visible_models(market, Identity("eve"))] == ["langid-97"]
    hub = RecordingHub()
    markets.launch(hub, market, user, "pytorch")  # type: ignore[arg-type]
    assert hub.posts == [("/users/dana/server", {"image": "pytorch", "gpu_memory": "0"})]  # the reader's own server
