"""The chart's values.schema.json and values.yaml agree with the settings model the hub reads them with."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from hub.chart_schema import SCHEMA, VALUES, default_differences, generated
from hub.kube_values import KubeValues
from tests.helm.test_chart import CHART, run_helm


def test_the_schemas_settings_are_the_models() -> None:
    """helm refuses what the hub would refuse: `python -m hub.chart_schema --write` after a model change."""
    current = json.loads(SCHEMA.read_text())
    assert generated(current) == current, "run: python -m hub.chart_schema --write"


def test_the_check_sees_a_schema_that_drifted() -> None:
    current = json.loads(SCHEMA.read_text())
    drifted = copy.deepcopy(current)
    rules = drifted["properties"]["groups"]["additionalProperties"]["properties"]
    del rules["teachers"]  # as the chart's schema was before it was generated: no teachers in a class
    drifted["properties"]["hub"]["properties"]["gpuIdleTimeout"]["minimum"] = 60
    assert generated(drifted) == current != drifted


def test_values_yaml_has_the_models_defaults() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert default_differences(values) == []
    values["hub"]["gpuIdleTimeout"] = 600
    values["hub"]["openSignup"] = True
    assert default_differences(values) == [
        "hub.gpuIdleTimeout: 600 in values.yaml, 900 in the settings model",
        "hub.openSignup: True in values.yaml; leave it null (the model's rule: closed with a class)",
    ]


@pytest.mark.process  # helm renders the chart
@pytest.mark.parametrize(("idle", "gpu_idle"), [(3600, 900), (1800, 1799), (1800, 1800), (600, 900)])
def test_the_charts_own_timeout_check_agrees_with_the_model(tmp_path: Path, idle: int, gpu_idle: int) -> None:
    """JSON schema cannot compare two values: the ConfigMap's template checks the rule at render time,
    and must say what the hub's reader says, on both sides of the boundary."""
    given = tmp_path / "v.yaml"
    given.write_text(yaml.safe_dump({"hub": {"idleTimeout": idle, "gpuIdleTimeout": gpu_idle}}))
    rendered = run_helm("template", "gs", str(CHART), "--values", str(given))
    try:
        KubeValues.model_validate(
            {"notebookImage": "i", "proxyApiUrl": "u", "idleTimeout": idle, "gpuIdleTimeout": gpu_idle}
        )
        model_accepts = True
    except ValueError:
        model_accepts = False
    assert (rendered.returncode == 0) == model_accepts, rendered.stderr
    if not model_accepts:
        assert f"({gpu_idle} s) must be below" in rendered.stderr


@pytest.mark.process  # helm renders the chart
@pytest.mark.parametrize(
    ("groups", "signup"),
    [({}, True), ({"ml101": {"members": ["ann"], "maxSlice": "4GiB"}}, False)],
    ids=["no-class", "a-class"],
)
def test_the_chart_leaves_signup_to_the_models_rule(tmp_path: Path, groups: dict[str, object], signup: bool) -> None:
    from hub.kube_values import load_kube_values
    from tests.helm.test_kube_values import rendered_values

    assert load_kube_values(rendered_values(tmp_path, {"groups": groups})).open_signup is signup


@pytest.mark.process  # helm renders the chart
def test_the_charts_trusted_proxies_reach_the_hubs_login_throttle(tmp_path: Path) -> None:
    from hub.kube_values import load_kube_values
    from tests.helm.test_kube_values import rendered_values

    values = load_kube_values(rendered_values(tmp_path, {"hub": {"trustedProxies": ["10.42.0.0/16"]}}))
    assert values.trusted_proxies == ("10.42.0.0/16",)
