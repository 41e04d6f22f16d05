"""The chart's weekly idle-holder notice: a CronJob running hub/renewals.py's Notices, the relay password a file."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from hub.kube_values import load_kube_values
from hub.settings import from_mapping
from tests.helm.test_chart import CHART, run_helm
from tests.helm.test_renewals import one, rendered

pytestmark = pytest.mark.process  # starts helm

RELAY = {
    "smtp_smarthost": "mail.example.org:587",
    "smtp_from": "gpuslice@example.org",
    "address": "{user}@students.example.org",
    "starttls": True,
    "username": "gpuslice",
    "existingSecret": "gpuslice-relay",
    "password_key": "password",
    "weekly": True,
    "min_idle_hours": 3,
}
PROMETHEUS = {"prometheusUrl": "http://prometheus-operated.monitoring:9090"}


def test_off_without_notice_mail_and_without_weekly(tmp_path: Path) -> None:
    assert not [o for o in rendered(tmp_path, {}) if "idle-notices" in o["metadata"]["name"]]
    (tmp_path / "not-weekly").mkdir()
    values = {"noticeMail": {**RELAY, "weekly": False}, "monitoring": PROMETHEUS}
    assert not [o for o in rendered(tmp_path / "not-weekly", values) if "idle-notices" in o["metadata"]["name"]]


def test_the_weekly_cronjob_runs_the_renewals_notices_with_the_password_as_a_file(tmp_path: Path) -> None:
    objects = rendered(tmp_path, {"noticeMail": RELAY, "monitoring": PROMETHEUS})
    job = one(objects, "CronJob", "gs-gpuslice-idle-notices")
    assert job["spec"]["schedule"] == "23 6 * * 1" and job["spec"]["concurrencyPolicy"] == "Forbid"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes API, no hub token: nothing to hold
    [container] = pod["containers"]
    assert container["args"][:5] == [
        "python",
        "-m",
        "hub.renewals",
        "--once=idle-notices",
        "--kube-values=/etc/gpuslice/values.yaml",
    ]
    assert "env" not in container and "envFrom" not in container
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["relay"] == {"name": "relay", "mountPath": "/etc/gpuslice-notice-mail", "readOnly": True}
    relay = next(v for v in pod["volumes"] if v["name"] == "relay")
    assert relay["secret"] == {"secretName": "gpuslice-relay", "defaultMode": 0o440}
    # The hub ConfigMap the job reads names the password's file, never a password.
    config = one(objects, "ConfigMap", "gs-gpuslice-hub")["data"]["values.yaml"]
    path = tmp_path / "values.yaml"
    path.write_text(config)
    values = load_kube_values(path)
    settings_relay = {k: v for k, v in RELAY.items() if k not in ("existingSecret", "password_key")}
    same = from_mapping({"notice_mail": {**settings_relay, "password_file": "/etc/gpuslice-notice-mail/password"}}, "t")
    assert values.notice_mail == same.notice_mail
    assert values.prometheus_url == PROMETHEUS["prometheusUrl"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"noticeMail": RELAY}, "set monitoring.prometheusUrl"),
        (
            {"noticeMail": {k: v for k, v in RELAY.items() if k != "existingSecret"}, "monitoring": PROMETHEUS},
            "set noticeMail.existingSecret",
        ),
        ({"noticeMail": {**RELAY, "password": "hunter2"}, "monitoring": PROMETHEUS}, "password"),
        ({"noticeMail": {**RELAY, "password_file": "/x"}, "monitoring": PROMETHEUS}, "password_file"),
        ({"noticeMail": {**RELAY, "smtp_from": "nobody"}, "monitoring": PROMETHEUS}, "smtp_from"),
    ],
    ids=["no-prometheus", "key-without-secret", "password-in-clear", "password-file", "bad-sender"],
)
def test_what_cannot_work_is_refused_at_install(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm("template", "gs", str(CHART), "--values", str(path))
    assert result.returncode != 0
    assert message in result.stderr
    assert "hunter2" not in result.stderr
