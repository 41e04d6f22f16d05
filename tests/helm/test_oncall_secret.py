"""On-call webhook URLs (they carry tokens) come from a Secret the admin made, mounted as files:
never a value rendered into a ConfigMap, never an environment variable. Real helm renders;
`gpuslice oncall-config` reads the files as the kubelet would lay them out (one file per key)."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from hub.cli import main
from hub.kube_values import ONCALL_SECRET_DIR
from tests.helm.test_chart import render, run_helm
from tests.helm.test_kube_values import ONCALL, rendered_values

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

# What a Slack or PagerDuty URL looks like: the path is the credential.
SECRET = {
    "alice": "https://hooks.slack.example/services/T000/B000/alice-token-1a2b3c",
    "platform": "https://events.pagerduty.example/integration/platform-token-4d5e6f/enqueue",
    "deadman": "https://deadman.example/ping/deadman-token-7a8b9c",
    "relay": "relay-password-0d1e2f",
}
TOKENS = ("alice-token-1a2b3c", "platform-token-4d5e6f", "deadman-token-7a8b9c", "relay-password-0d1e2f")


def render_failure(tmp_path: Path, oncall: dict[str, Any]) -> str:
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump({"monitoring": {"oncall": oncall}}))
    result = run_helm("template", "gs", str(Path(__file__).parents[2] / "helm" / "gpuslice"), "--values", str(given))
    leaked = [line.strip() for line in result.stdout.splitlines() if any(token in line for token in TOKENS)]
    assert result.returncode != 0, f"the chart rendered a webhook URL given as a value: {leaked}"
    return result.stderr


@pytest.mark.parametrize(
    ("oncall", "told"),
    [
        (
            {"rotation": [{"name": "alice", "webhook_url": SECRET["alice"]}]},
            "rotation[0].webhook_url: a webhook URL would land in the hub ConfigMap; put it in a Secret",
        ),
        (
            {"second_line": {"name": "platform", "webhook_url": SECRET["platform"]}},
            "give webhook_url_key: platform",
        ),
        ({"deadman_url": SECRET["deadman"]}, "put it in the Secret monitoring.oncall.existingSecret"),
        ({"smtp_auth_password": SECRET["relay"]}, "give smtp_auth_password_key"),
        (
            {"rotation": [{"name": "alice", "webhook_url_key": "alice"}]},
            "set monitoring.oncall.existingSecret to the name of the Secret",
        ),
    ],
    ids=["rotation", "second-line", "deadman", "relay-password", "key-without-secret"],
)
def test_a_webhook_url_as_a_value_is_refused_saying_where_it_goes(
    tmp_path: Path, oncall: dict[str, Any], told: str
) -> None:
    error = render_failure(tmp_path, oncall)
    assert told in error
    assert not any(token in error for token in TOKENS)  # the refusal does not print the URL either


def chart_oncall() -> dict[str, Any]:
    return {**ONCALL, "deadman_url_key": "deadman", "smtp_auth_username": "alerts", "smtp_auth_password_key": "relay"}


def volumes_and_mounts(doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    spec = doc["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    containers = spec["containers"]
    mounts = [m for c in containers for m in c.get("volumeMounts", [])]
    return volumes, mounts, [e for c in containers for e in c.get("env", [])]


@pytest.mark.parametrize(("companion", "pod"), [(False, "hub"), (True, "portal")], ids=["hub", "companion"])
def test_the_secret_is_a_0440_file_in_the_pod_that_writes_the_config_only(
    tmp_path: Path, companion: bool, pod: str
) -> None:
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump({"monitoring": {"oncall": chart_oncall()}, "hub": {"enabled": not companion}}))
    deployments = {d["metadata"]["name"]: d for d in render(given) if d["kind"] == "Deployment"}
    holders = []
    for name, doc in deployments.items():
        volumes, mounts, env = volumes_and_mounts(doc)
        secret_volumes = [v for v in volumes.values() if v.get("secret", {}).get("secretName") == "gpuslice-oncall"]
        refs = [e for e in env if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "gpuslice-oncall"]
        assert refs == [], f"{name} has the on-call Secret in its environment"
        if secret_volumes:
            holders.append(name)
            (volume,) = secret_volumes
            assert volume["secret"]["defaultMode"] == 0o440
            (mount,) = [m for m in mounts if m["name"] == volume["name"]]
            assert (mount["mountPath"], mount["readOnly"]) == (str(ONCALL_SECRET_DIR), True)
    assert holders == [f"gs-gpuslice-{pod}"]


def secret_mounted(folder: Path, keys: dict[str, str]) -> Path:
    """The Secret's keys as the kubelet lays them out: one file per key, the value as it was given."""
    folder.mkdir()
    for key, value in keys.items():
        (folder / key).write_text(value)
    return folder


def test_no_rendered_object_holds_a_url_and_the_config_has_them_from_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = rendered_values(tmp_path, {"monitoring": {"oncall": chart_oncall()}})
    given = tmp_path / "given.yaml"
    manifests = yaml.safe_dump_all(render(given))
    assert "webhook_url_key: alice" in values.read_text()
    assert not any(token in manifests for token in TOKENS)

    secret = secret_mounted(tmp_path / "oncall", {k: v + "\n" for k, v in SECRET.items()})  # a trailing newline
    assert main(["oncall-config", "--kube-values", str(values), "--secret-dir", str(secret)]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    receivers = {r["name"]: r for r in config["receivers"]}
    assert list(receivers) == ["default", "first-line-alice", "first-line-bob", "second-line", "owner", "deadman"]
    assert receivers["first-line-alice"]["webhook_configs"][0]["url"] == SECRET["alice"]
    assert receivers["second-line"]["webhook_configs"][0]["url"] == SECRET["platform"]
    assert receivers["deadman"]["webhook_configs"][0]["url"] == SECRET["deadman"]
    assert receivers["owner"]["email_configs"][0]["to"] == "dave@example.org"
    assert config["global"] == {
        "smtp_smarthost": "mail.example.org:25",
        "smtp_from": "alerts@example.org",
        "smtp_auth_username": "alerts",
        "smtp_auth_password": SECRET["relay"],
        "smtp_require_tls": True,
    }


@pytest.mark.parametrize(
    ("keys", "told"),
    [
        (
            {"alice": SECRET["alice"], "deadman": SECRET["deadman"]},
            "on-call contact platform-team: cannot read webhook_url_file {dir}/platform (No such file or directory): "
            "on Kubernetes add the key platform to the Secret named by monitoring.oncall.existingSecret",
        ),
        ({**SECRET, "platform": "\n"}, "on-call contact platform-team: webhook_url_file {dir}/platform is empty"),
        ({**SECRET, "deadman": "ping me"}, "the dead man's switch: deadman_url_file {dir}/deadman does not hold one"),
        ({k: v for k, v in SECRET.items() if k != "relay"}, "cannot read smtp_auth_password_file {dir}/relay"),
    ],
    ids=["missing", "empty", "not-a-url", "no-relay-password"],
)
def test_a_missing_or_empty_key_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: dict[str, str], told: str
) -> None:
    values = rendered_values(tmp_path, {"monitoring": {"oncall": chart_oncall()}})
    secret = secret_mounted(tmp_path / "oncall", keys)
    assert main(["oncall-config", "--kube-values", str(values), "--secret-dir", str(secret)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no half config to paste into Alertmanager
    assert told.format(dir=secret) in err
    assert not any(token in err for token in TOKENS)
