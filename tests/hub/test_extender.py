"""`gpuslice scheduler-extender` answers kube-scheduler's own requests, in kube-scheduler's JSON.

The bodies below are literal: what kube-scheduler's HTTPExtender marshals (encoding/json of
the k8s.io/kube-scheduler/extender/v1 types, whose fields carry no JSON tags) for the cluster
of its own extender integration test, five nodes "machine1".."machine5" and the pod
"extender-test-pod" (here asking for aliyun.com/gpu-mem, the extender's managed resource,
where the test asks for foo.com/bar). Sources:

* kubernetes/kube-scheduler extender/v1/types.go and types_test.go (TestCompatibility: the
  exact JSON of each type, and that lowercased JSON decodes to the same), commit
  e87dbddd27a5bd4c2028727c7ccc082cfb2cdc09;
* kubernetes/kubernetes pkg/scheduler/extender.go (HTTPExtender: send() POSTs JSON and takes
  only HTTP 200; Filter sends NodeNames when nodeCacheCapable, else Nodes as a NodeList,
  and refuses a filtered node name not in its input; Bind's ExtenderBindingArgs), commit
  02850301e61b0491a6efad7fb440dfa1b03cfc96;
* kubernetes/kubernetes test/integration/scheduler/extender/extender_test.go (the test's
  extender: "Decode error" 400, an Error in the filter result, FailedNodes per node),
  commit 111f2c87e0d048bcffde85a56b26328ed8cc266a.

Each answer is checked as Go would decode it into the result type (``go_decode``), then for
what it says. The cluster behind the extender is the API double with the same nodes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from hub.extender import RestKubeClient, make_app
from spawner.sharing import backend as sharing
from tests.kube.apiserver import ApiServer

pytestmark = pytest.mark.process  # the extender's HTTP server and the API double on loopback sockets

Obj = dict[str, Any]
NOW_NS = 1_700_000_000_123_456_789


def go_node(name: str, gpu_cards: int) -> str:
    """A v1.Node as encoding/json writes it (types_test.go's node, with this node's capacity)."""
    gpus = f',"aliyun.com/gpu-count":"{gpu_cards}","aliyun.com/gpu-mem":"{16 * gpu_cards}"' if gpu_cards else ""
    capacity = f'{{"cpu":"8","memory":"32Gi","pods":"32"{gpus}}}'
    return (
        f'{{"metadata":{{"name":"{name}","uid":"uid-{name}","resourceVersion":"1","creationTimestamp":null}},'
        f'"spec":{{}},"status":{{"capacity":{capacity},"allocatable":{capacity},'
        '"conditions":[{"type":"Ready","status":"True","lastHeartbeatTime":null,"lastTransitionTime":null,'
        '"reason":"schedulable condition"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},'
        '"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"",'
        '"containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"",'
        '"architecture":""}}}'
    )


# machine1 and machine2: one 16 GiB card each (machine1's held 14 GiB by "busy"); machine3: no GPU.
NODES = {"machine1": go_node("machine1", 1), "machine2": go_node("machine2", 1), "machine3": go_node("machine3", 0)}
# The pod as the scheduler marshals it from its informer: metadata, spec, status.
POD = (
    '{"metadata":{"name":"extender-test-pod","namespace":"ns","uid":"3f1b7c9e-0d55-4a7c-9a43-8d2f5e6b1a20",'
    '"resourceVersion":"7","creationTimestamp":"2024-05-01T10:00:00Z"},'
    '"spec":{"containers":[{"name":"container","image":"registry.k8s.io/pause:3.10",'
    '"resources":{"limits":{"aliyun.com/gpu-mem":"4"},"requests":{"aliyun.com/gpu-mem":"4"}},'
    '"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File",'
    '"imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,'
    '"dnsPolicy":"ClusterFirst","serviceAccountName":"default","securityContext":{},'
    '"schedulerName":"gpuslice-scheduler","enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},'
    '"status":{"phase":"Pending","qosClass":"BestEffort"}}'
)
NAMES = '["machine1","machine2","machine3"]'
# ExtenderArgs, nodeCacheCapable: NodeNames, Nodes null.
FILTER_BY_NAMES = f'{{"Pod":{POD},"Nodes":null,"NodeNames":{NAMES}}}'
# ExtenderArgs otherwise: the candidates as a NodeList (no kind, as Go writes an empty TypeMeta), NodeNames null.
FILTER_BY_NODES = f'{{"Pod":{POD},"Nodes":{{"metadata":{{}},"items":[{",".join(NODES.values())}]}},"NodeNames":null}}'
PRIORITIZE = f'{{"Pod":{POD},"Nodes":null,"NodeNames":["machine2"]}}'
BIND = (
    '{"PodName":"extender-test-pod","PodNamespace":"ns","PodUID":"3f1b7c9e-0d55-4a7c-9a43-8d2f5e6b1a20",'
    '"Node":"machine2"}'
)
BIND_WHERE_FULL = BIND.replace('"Node":"machine2"', '"Node":"machine1"')


def go_decode(answer: Any, kind: str) -> Any:
    """The answer decoded as Go decodes it into extender/v1's result types: a wrong JSON type is an error."""

    def strings(value: Any) -> bool:
        return value is None or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))

    if kind == "ExtenderFilterResult":
        assert isinstance(answer, dict)
        assert answer.get("Nodes") is None or isinstance(answer["Nodes"].get("items"), list)
        names = answer.get("NodeNames")
        assert names is None or (isinstance(names, list) and all(isinstance(n, str) for n in names))
        assert strings(answer.get("FailedNodes")) and strings(answer.get("FailedAndUnresolvableNodes"))
        assert isinstance(answer.get("Error", ""), str)
    elif kind == "HostPriorityList":
        assert isinstance(answer, list)
        for entry in answer:  # Score is an int64: 10.0 would not decode
            assert isinstance(entry["Host"], str) and type(entry["Score"]) is int
    else:
        assert kind == "ExtenderBindingResult" and isinstance(answer.get("Error", ""), str)
    return answer


class Scheduler:
    """kube-scheduler's side: POST a literal body to a verb, read the answer as HTTPExtender.send does."""

    def __init__(self, extender_url: str, api_url: str) -> None:
        self.extender_url, self.api_url = extender_url, api_url

    async def send(self, verb: str, body: str, kind: str) -> Any:
        headers = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.extender_url}/{verb}", data=body, headers=headers) as answer,
        ):
            assert answer.status == 200, f"failed {verb} with extender, code {answer.status}: {await answer.text()}"
            return go_decode(json.loads(await answer.text()), kind)

    async def pod(self) -> Obj:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.api_url}/api/v1/namespaces/ns/pods/extender-test-pod") as answer,
        ):
            found: Obj = await answer.json()
            return found


def with_extender(test: Callable[[Scheduler], Awaitable[None]]) -> None:
    async def run() -> None:
        api = ApiServer([json.loads(n) for n in NODES.values()], kubelet=False, namespaces=("ns",))
        api_server = TestServer(api.app(), host="127.0.0.1")
        await api_server.start_server()
        api_url = str(api_server.make_url("")).rstrip("/")
        extender = TestServer(make_app(RestKubeClient(api_url), sharing("gpushare"), clock=lambda: NOW_NS))
        await extender.start_server()
        try:
            busy = {
                "metadata": {
                    "name": "busy",
                    "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "14"},
                },
                "spec": {
                    "nodeName": "machine1",
                    "containers": [{"name": "c", "image": "i", "resources": {"limits": {"aliyun.com/gpu-mem": "14"}}}],
                },
            }
            async with aiohttp.ClientSession(api_url) as http:
                for body in (busy, json.loads(POD)):
                    body["metadata"] = {
                        k: v for k, v in body["metadata"].items() if k not in ("uid", "resourceVersion")
                    }
                    async with http.post("/api/v1/namespaces/ns/pods", json=body) as created:
                        assert created.status == 201, await created.text()
            await test(Scheduler(str(extender.make_url("")).rstrip("/"), api_url))
        finally:
            await extender.close()
            await api_server.close()

    asyncio.run(run())


def test_filter_by_names_keeps_the_node_with_room_and_says_why_of_the_others() -> None:
    async def check(scheduler: Scheduler) -> None:
        answer = await scheduler.send("filter", FILTER_BY_NAMES, "ExtenderFilterResult")
        assert answer["NodeNames"] == ["machine2"] and answer["Nodes"] is None and answer["Error"] == ""
        # machine1 is full (preempting "busy" would make room); machine3 has no GPU at all
        assert set(answer["FailedNodes"]) == {"machine1"}
        assert set(answer["FailedAndUnresolvableNodes"]) == {"machine3"}
        assert all(answer["FailedNodes"].values()) and all(answer["FailedAndUnresolvableNodes"].values())

    with_extender(check)


def test_filter_by_nodes_answers_with_the_node_objects_it_was_given() -> None:
    async def check(scheduler: Scheduler) -> None:
        answer = await scheduler.send("filter", FILTER_BY_NODES, "ExtenderFilterResult")
        assert answer["NodeNames"] is None and answer["Error"] == ""
        # HTTPExtender takes result.Nodes.Items as they are: the node kube-scheduler sent, unchanged
        assert answer["Nodes"]["items"] == [json.loads(NODES["machine2"])]

    with_extender(check)


def test_prioritize_scores_each_candidate_once_within_the_extender_range() -> None:
    async def check(scheduler: Scheduler) -> None:
        answer = await scheduler.send("prioritize", PRIORITIZE, "HostPriorityList")
        assert answer == [{"Host": "machine2", "Score": 10}]  # MaxExtenderPriority

    with_extender(check)


def test_bind_binds_and_a_bind_that_cannot_be_done_says_why_in_error() -> None:
    async def check(scheduler: Scheduler) -> None:
        refused = await scheduler.send("bind", BIND_WHERE_FULL, "ExtenderBindingResult")
        assert "no longer fits on machine1" in refused["Error"]
        assert not (await scheduler.pod())["spec"].get("nodeName")  # nothing written
        assert await scheduler.send("bind", BIND, "ExtenderBindingResult") == {"Error": ""}
        bound = await scheduler.pod()
        assert bound["spec"]["nodeName"] == "machine2"
        assert bound["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        again = await scheduler.send("bind", BIND, "ExtenderBindingResult")
        assert "409" in again["Error"]  # the API server's answer: already assigned

    with_extender(check)


def test_lowercased_bodies_decode_as_go_decodes_them() -> None:
    """types_test.go's TestCompatibility: the JSON lowercased whole still decodes to the same arguments."""

    async def check(scheduler: Scheduler) -> None:
        exact = await scheduler.send("filter", FILTER_BY_NAMES, "ExtenderFilterResult")
        assert await scheduler.send("filter", FILTER_BY_NAMES.lower(), "ExtenderFilterResult") == exact
        assert await scheduler.send("prioritize", PRIORITIZE.lower(), "HostPriorityList") == [
            {"Host": "machine2", "Score": 10}
        ]
        assert await scheduler.send("bind", BIND.lower(), "ExtenderBindingResult") == {"Error": ""}

    with_extender(check)


def test_a_request_it_cannot_serve_is_an_error_in_the_result_and_no_json_is_a_400() -> None:
    async def check(scheduler: Scheduler) -> None:
        answer = await scheduler.send(
            "filter", '{"Pod":null,"Nodes":null,"NodeNames":["machine2"]}', "ExtenderFilterResult"
        )
        assert answer["Error"] and not answer["NodeNames"]
        async with aiohttp.ClientSession() as http, http.post(f"{scheduler.extender_url}/filter", data="{") as bad:
            assert bad.status == 400

    with_extender(check)


# kube-scheduler's own bodies, verbatim: TestCompatibility's expectJSON for ExtenderArgs and for
# ExtenderBindingArgs (kubernetes/kubernetes staging/src/k8s.io/kube-scheduler/extender/v1/types_test.go,
# commit 9891f82d816be0f7ee3ff1eb080089737ad596c9). A pod of no containers ("containers":null) on
# nodes this cluster has never heard of; a binding of a pod that does not exist.
GO_EXTENDER_ARGS = (
    '{"Pod":{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}},'
    '"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},'
    '"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"",'
    '"bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"",'
    '"kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"]}'
)
GO_BINDING_ARGS = '{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}'


def test_kube_schedulers_own_compatibility_bodies_are_decoded_and_answered_in_its_types() -> None:
    async def check(scheduler: Scheduler) -> None:
        # A pod that asks for no GPU is not the extender's to judge: every candidate passes, and
        # HTTPExtender's two forms (names, node objects) each come back as they were sent.
        for verb_body in (GO_EXTENDER_ARGS, GO_EXTENDER_ARGS.lower()):
            answer = await scheduler.send("filter", verb_body, "ExtenderFilterResult")
            assert answer["Error"] == "" and not answer.get("FailedNodes"), answer
            assert answer["NodeNames"] == ["node1"] or [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == [
                "nodename"
            ]
            scores = await scheduler.send("prioritize", verb_body, "HostPriorityList")
            assert {s["Host"] for s in scores} <= {"node1", "nodename"}
        refused = await scheduler.send("bind", GO_BINDING_ARGS, "ExtenderBindingResult")
        assert "mypodname" in refused["Error"], refused  # said in the result's Error, with HTTP 200

    with_extender(check)
