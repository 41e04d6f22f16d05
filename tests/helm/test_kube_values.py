"""The chart's values as the hub, the culler and the portal read them: helm renders, hub/kube_values.py reads."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from hub.kube_values import KubeValuesError, load_kube_values
from spawner import environ, sharing
from spawner.quotas import GroupRules
from tests.helm.test_chart import ALL_FEATURES, render

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

CLASSES = {
    "groups": {"ml101": {"members": ["alice", "bob"], "maxSlice": "4GiB", "budget": "16GiB", "profiles": ["t4"]}},
    "adminUsers": ["teacher"],
    "monitoring": {
        "prometheusUrl": "http://prometheus-operated.monitoring:9090",
        "alertmanagerUrl": "http://alertmanager-operated.monitoring:9093",
    },
    "hub": {"idleTimeout": 1800, "gpuIdleTimeout": 600},
    "markets": {"proposalsPerHour": 5},
}


def rendered_values(folder: Path, values: dict[str, Any] | None = None, *extra: Path) -> Path:
    """The hub ConfigMap's values.yaml of ``helm template`` with ``values``, written to ``folder``."""
    given = folder / "given.yaml"
    given.write_text(yaml.safe_dump(values or {}))
    docs = render(given, *extra)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gs-gpuslice-hub")
    path = folder / "values.yaml"
    path.write_text(config["data"]["values.yaml"])
    return path


@pytest.mark.parametrize("extra", [(), (ALL_FEATURES,)], ids=["defaults", "all-features"])
def test_every_rendered_key_is_read_by_the_one_reader(tmp_path: Path, extra: tuple[Path, ...]) -> None:
    values = load_kube_values(rendered_values(tmp_path, None, *extra))  # a key the model lacks is refused
    assert values.proxy_api_url == "http://gs-gpuslice-proxy-api:8001"
    assert values.data_dir == Path("/srv/gpuslice/data")


def test_the_portals_values_come_from_the_chart(tmp_path: Path) -> None:
    values = load_kube_values(rendered_values(tmp_path, CLASSES))
    assert values.prometheus_url == "http://prometheus-operated.monitoring:9090"
    assert values.alertmanager_url == "http://alertmanager-operated.monitoring:9093"
    assert values.groups == (
        GroupRules(name="ml101", members=("alice", "bob"), max_slice="4GiB", budget="16GiB", profiles=("t4",)),
    )
    assert (values.admin_users, values.idle_timeout, values.proposals_per_hour) == (("teacher",), 1800, 5)
    assert values.gpu_idle_timeout == 600
    assert load_kube_values(rendered_values(tmp_path)).gpu_idle_timeout == 900  # the chart's default


def test_a_gpu_idle_timeout_the_culler_would_beat_is_refused_saying_why(tmp_path: Path) -> None:
    """The culler would stop the idle server first: reclaiming for the line could never happen."""
    with pytest.raises(AssertionError, match=r"hub.gpuIdleTimeout \(3600 s\) must be below hub.idleTimeout \(3600 s\)"):
        rendered_values(tmp_path, {"hub": {"gpuIdleTimeout": 3600}})
    with pytest.raises(AssertionError, match=r"gpuIdleTimeout.*minimum"):  # the schema: a minute at least
        rendered_values(tmp_path, {"hub": {"gpuIdleTimeout": 0}})
    written = tmp_path / "hand.yaml"  # a values file written by hand, not rendered: the reader says the same
    written.write_text(
        yaml.safe_dump({"notebookImage": "i", "proxyApiUrl": "u", "idleTimeout": 600, "gpuIdleTimeout": 900})
    )
    with pytest.raises(KubeValuesError, match="lower gpuIdleTimeout or raise idleTimeout"):
        load_kube_values(written)


def test_the_presence_timeouts_are_the_charts_values_and_their_order_is_checked_by_helm_too(tmp_path: Path) -> None:
    values = load_kube_values(rendered_values(tmp_path, {"hub": {"gpuLeftTimeout": 60, "gpuNoInputTimeout": 300}}))
    assert (values.gpu_left_timeout, values.gpu_no_input_timeout, values.gpu_release_timeout) == (60, 300, 600)
    with pytest.raises(AssertionError, match=r"hub.gpuReleaseTimeout \(600 s\) must be above hub.gpuNoInputTimeout"):
        rendered_values(tmp_path, {"hub": {"gpuNoInputTimeout": 900}})
    with pytest.raises(AssertionError, match=r"hub.gpuNoInputTimeout \(480 s\) must be at least hub.gpuLeftTimeout"):
        rendered_values(tmp_path, {"hub": {"gpuLeftTimeout": 500}})


def test_database_urls_come_from_the_secrets_else_the_hubs_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = load_kube_values(rendered_values(tmp_path))
    assert values.db_url(environ.read({})) == "sqlite:////srv/gpuslice/data/jupyterhub.sqlite"
    assert values.market_url(environ.read({})) == "sqlite:////srv/gpuslice/data/market.sqlite"
    secret = environ.read({"GPUSLICE_MARKET_URL": "postgresql://market@db/market"})
    assert values.market_url(secret) == "postgresql://market@db/market"


def test_a_values_file_from_another_release_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = rendered_values(tmp_path)
    path.write_text(path.read_text() + "brandNewKey: 1\n")
    with pytest.raises(KubeValuesError, match="brandNewKey"):
        load_kube_values(path)
    path.write_text("notebookImage: x\nproxyApiUrl: y\ngroups: {ml101: {maxSlise: 4GiB}}\n")
    with pytest.raises(KubeValuesError, match=r"max_slise.*did you mean max_slice"):
        load_kube_values(path)


ONCALL = {
    "existingSecret": "gpuslice-oncall",
    "rotation": [{"name": "alice", "webhook_url_key": "alice"}, {"name": "bob", "email": "bob@example.org"}],
    "second_line": {"name": "platform-team", "webhook_url_key": "platform"},
    "owner": {"name": "dave", "email": "dave@example.org"},
    "escalate_after": "10m",
    "smtp_smarthost": "mail.example.org:25",
    "smtp_from": "alerts@example.org",
}
# The same in gpuslice.yaml: the Secret's keys are files where the chart mounts the Secret.
ONCALL_AS_SETTINGS = {
    **{k: v for k, v in ONCALL.items() if k != "existingSecret"},
    "rotation": [
        {"name": "alice", "webhook_url_file": "/etc/gpuslice-oncall/alice"},
        {"name": "bob", "email": "bob@example.org"},
    ],
    "second_line": {"name": "platform-team", "webhook_url_file": "/etc/gpuslice-oncall/platform"},
}


def test_oncall_values_become_the_same_typed_settings(tmp_path: Path) -> None:
    from hub.settings import from_mapping

    path = rendered_values(tmp_path, {"monitoring": {"oncall": ONCALL}})
    values = load_kube_values(path)
    expected = from_mapping({"monitoring": {"oncall": ONCALL_AS_SETTINGS}}, "gpuslice.yaml").monitoring.oncall
    assert values.oncall == expected
    assert [c.name for c in values.oncall.contacts()] == ["alice", "bob", "platform-team", "dave"]
    assert values.oncall.escalate_after == "10m"
    (tmp_path / "defaults").mkdir()
    assert load_kube_values(rendered_values(tmp_path / "defaults")).oncall.enabled is False  # the default: {}


@pytest.mark.parametrize(
    ("oncall", "message"),
    [
        ({"rotation": [{"name": "bob", "email": "bob@example.org"}]}, "smtp_smarthost and smtp_from"),
        ({"escalate_after": "ten minutes"}, "15m or 1h30m"),
    ],
)
def test_bad_oncall_values_are_refused_naming_the_key(tmp_path: Path, oncall: dict[str, Any], message: str) -> None:
    with pytest.raises(KubeValuesError, match=message):
        load_kube_values(rendered_values(tmp_path, {"monitoring": {"oncall": oncall}}))


def test_a_misspelt_oncall_key_is_refused_by_the_charts_schema(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="invalid propertyName 'rotaton'"):
        rendered_values(tmp_path, {"monitoring": {"oncall": {"rotaton": []}}})


@pytest.mark.parametrize(
    "gpu_sharing",
    [{"backend": "gpushare", "gpushareMemoryUnit": "MiB"}, {"backend": "dra", "dra": {"slices": "mig"}}],
    ids=["gpushare-MiB", "dra-mig"],
)
def test_the_portal_reads_the_cluster_with_the_backend_the_hubs_spawner_has(
    tmp_path: Path, gpu_sharing: dict[str, Any]
) -> None:
    """The portal's GPUs page reads the pods as the spawner wrote them: a setting that is not the default
    (gpushare counting MiB, DRA holding slices as MIG devices) reaches both from the same values."""
    from spawner.kube import KubeGpuSpawner

    values = load_kube_values(rendered_values(tmp_path, {"gpuSharing": gpu_sharing}))
    traits = SimpleNamespace(  # the spawner's traits as hub/kube_config.py sets them from the values
        gpu_backend=values.backend,
        gpushare_memory_unit=values.gpushare_memory_unit,
        gpu_backend_settings=sharing.settings_from_values(values.backend, values.backend_settings),
    )
    spawners = KubeGpuSpawner.sharing_backend(traits)  # type: ignore[arg-type]
    assert values.sharing_backend() == spawners
    assert values.sharing_backend() != sharing.backend(values.backend)  # the defaults would read them wrong
