"""The hub's listing of nodes and pods (spawner/kube.py ClusterCache): shared by the spawns of one moment, but a
spawn places on a listing begun after it began, so pods another process made since the last one are counted."""

import asyncio
import json
import time
from typing import Any

from spawner.kube import ClusterCache


class Answer:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.status = 200
        self._raw = json.dumps({"items": items}).encode()

    async def read(self) -> bytes:
        return self._raw


class Api:
    """The API as the job dispatcher's Job controller changes it: pods appear between the hub's listings."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.listings = 0

    async def list_node(self, **_: Any) -> Answer:
        return Answer([{"metadata": {"name": "gpu-a"}}])

    async def list_namespaced_pod(self, namespace: str, **_: Any) -> Answer:
        self.listings += 1
        return Answer(list(self.pods))


def test_a_spawn_places_on_a_listing_begun_after_it_began() -> None:
    async def run() -> None:
        api, cache = Api(), ClusterCache()
        spawn_started = time.monotonic()
        first = await cache.get(api, "lab", 3600, since=spawn_started)
        assert (await cache.get(api, "lab", 3600, since=spawn_started)) is first  # the same moment: one listing
        api.pods.append({"metadata": {"name": "gpuslice-job-5-1-x"}})  # a backfill job's pod, made by another process
        assert (await cache.get(api, "lab", 3600)).pods == []  # a look that places nothing may reuse the listing
        later = await cache.get(api, "lab", 3600, since=time.monotonic())
        assert [p["metadata"]["name"] for p in later.pods] == ["gpuslice-job-5-1-x"] and api.listings == 2

    asyncio.run(run())
