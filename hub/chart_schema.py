"""The chart's values.schema.json, where it holds settings, generated from the settings model.

helm checks a release's values against helm/gpuslice/values.schema.json before it renders
anything. The parts of it that are settings (the groups and their rules, the timeouts,
sign-up, the backend and policy, ...) are written here from the model the hub reads them
with (hub/kube_values.py ``KubeValues``, spawner/quotas.py ``GroupRules``), so helm refuses
what the hub would refuse. The rest of the schema (images, resources, volumes) is the
chart's own. ``CHART_VALUES`` names where each field sits in values.yaml; the ConfigMap
(templates/hub/configmap.yaml) renders it there for the hub.

    python -m hub.chart_schema --write    # after changing a field of the model
    python -m hub.chart_schema            # exit 1 when the schema or values.yaml's defaults differ

tests/helm/test_chart_schema.py runs the check.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic.alias_generators import to_camel

from hub.kube_values import NOTICE_SECRET_DIR, KubeValues
from hub.settings import NoticeMail
from spawner.quotas import GroupRules

CHART = Path(__file__).resolve().parents[1] / "helm" / "gpuslice"
SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"

# values.yaml's path of each KubeValues field that is a setting people choose.
CHART_VALUES = {
    "gpuSharing.backend": "backend",
    "gpuSharing.policy": "policy",
    "gpuSharing.gpushareMemoryUnit": "gpushare_memory_unit",
    "adminUsers": "admin_users",
    "groups": "groups",
    "hub.idleTimeout": "idle_timeout",
    "hub.gpuIdleTimeout": "gpu_idle_timeout",
    "hub.gpuLeftTimeout": "gpu_left_timeout",
    "hub.gpuNoInputTimeout": "gpu_no_input_timeout",
    "hub.gpuReleaseTimeout": "gpu_release_timeout",
    "hub.openSignup": "open_signup",
    "hub.trustedProxies": "trusted_proxies",
    "hub.cpuJobs": "cpu_jobs",
    "markets.proposalsPerHour": "proposals_per_hour",
    "monitoring.prometheusUrl": "prometheus_url",
    "monitoring.alertmanagerUrl": "alertmanager_url",
    "noticeMail": "notice_mail",
}

# noticeMail's keys that are the chart's, not the model's: files in the pod are keys of a Secret.
NOTICE_MAIL_FILES = {"password_file": "password_key", "ca_file": "ca_key"}
NOTICE_MAIL_CHART_KEYS: dict[str, Any] = {
    "existingSecret": {
        "type": "string",
        "description": f"A Secret you create whose keys hold the relay password and CA (password_key, ca_key): "
        f"mounted as 0440 files under {NOTICE_SECRET_DIR} in the notice's CronJob only.",
    },
    "password_key": {"$ref": "#/definitions/secretKey"},
    "ca_key": {"$ref": "#/definitions/secretKey"},
    "schedule": {
        "type": "string",
        "minLength": 9,
        "description": "When the CronJob mails last week's notices (cron syntax, the cluster's time zone).",
    },
}


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A field's JSON schema as the chart writes it: no title, no default (values.yaml has it), no null."""
    if "anyOf" in schema:
        kept = [s for s in schema["anyOf"] if s != {"type": "null"}]
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        schema = {**rest, **kept[0]} if len(kept) == 1 else schema
    return {k: v for k, v in schema.items() if k not in ("title", "default")}


def group_rules_schema() -> dict[str, Any]:
    """``groups``: class names to their rules, camelCase as the chart's values are (maxSlice)."""
    fields = GroupRules.model_json_schema()["properties"]
    rules = {to_camel(name): _plain(fields[name]) for name in GroupRules.model_fields if name != "name"}
    return {
        "type": "object",
        "description": str(KubeValues.model_fields["groups"].description),
        "additionalProperties": {"type": "object", "additionalProperties": False, "properties": rules},
    }


def notice_mail_schema() -> dict[str, Any]:
    """``noticeMail``: notice_mail's keys, with the files in the pod (the password, the CA) as keys of a Secret."""
    fields = NoticeMail.model_json_schema()["properties"]
    keys = {name: _plain(fields[name]) for name in NoticeMail.model_fields if name not in NOTICE_MAIL_FILES}
    return {
        "type": "object",
        "description": str(KubeValues.model_fields["notice_mail"].description),
        "additionalProperties": False,
        "properties": {**keys, **NOTICE_MAIL_CHART_KEYS},
    }


def field_schema(field: str) -> dict[str, Any]:
    """The JSON schema of one KubeValues field, as the chart's values.schema.json has it."""
    if field == "groups":
        return group_rules_schema()
    if field == "notice_mail":
        return notice_mail_schema()
    alias = KubeValues.model_fields[field].alias or field
    return _plain(KubeValues.model_json_schema(by_alias=True)["properties"][alias])


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the settings' parts written from the model (the rest as it is)."""
    out = copy.deepcopy(schema)
    for path, field in CHART_VALUES.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node["properties"][key]
        node["properties"][leaf] = field_schema(field)
    return out


def default_differences(values: dict[str, Any]) -> list[str]:
    """Each chart default in values.yaml that is not the model's (an unset openSignup is the model's rule)."""
    found = []
    for path, field in CHART_VALUES.items():
        value: Any = values
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        default = KubeValues.model_fields[field].get_default(call_default_factory=True)
        if field == "open_signup":
            if value is not None:
                found.append(f"{path}: {value!r} in values.yaml; leave it null (the model's rule: closed with a class)")
            continue
        if isinstance(default, tuple):
            default = {} if field == "groups" else list(default)
        if field == "notice_mail" and default is None:
            default = {}  # values.yaml's {}: no relay, no notice
        if value != default:
            found.append(f"{path}: {value!r} in values.yaml, {default!r} in the settings model")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="rewrite values.schema.json from the model")
    args = parser.parse_args(argv)
    current = json.loads(SCHEMA.read_text())
    wanted = generated(current)
    if args.write:
        SCHEMA.write_text(json.dumps(wanted, indent=2) + "\n")
    elif wanted != current:
        print(f"{SCHEMA} differs from the settings model: python -m hub.chart_schema --write", file=sys.stderr)
        return 1
    differences = default_differences(yaml.safe_load(VALUES.read_text()))
    for line in differences:
        print(f"{VALUES}: {line}", file=sys.stderr)
    return 1 if differences else 0


if __name__ == "__main__":
    raise SystemExit(main())
