"""The spawn page as a student meets it: the form's choices, a refusal that keeps them, the stages."""

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.platform import Platform, Session

NO_ISOLATION = "without memory isolation"


@pytest.fixture(scope="module")
def school(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One platform for the module: class ml101 (slices up to 4 GiB, no whole GPUs, 5 GiB budget)."""
    root: Path = tmp_path_factory.mktemp("school")
    members = ["sam", "tom", "uma"]
    running = Platform(
        root, {"groups": {"ml101": {"members": members, "max_slice": "4GiB", "max_gpus": 0, "budget": "5GiB"}}}
    )
    running.start()
    yield running
    running.stop()


def _selected(page: str, name: str) -> list[str]:
    select = re.search(rf'<select[^>]*name="{name}".*?</select>', page, re.S)
    assert select is not None, page[:2000]
    return re.findall(r'<option value="([^"]*)" selected>', select.group(0))


def _error(page: str) -> str:
    found = re.search(r"<p class=\"spawn-error-msg alert alert-danger\">(.*?)</p>", page, re.S)
    assert found is not None, page[:3000]
    return re.sub(r"\s+", " ", found.group(1)).strip()


def test_the_form_offers_what_the_class_allows_with_its_slice_chosen(school: Platform) -> None:
    page = school.login("sam").get(f"{school.url}/hub/spawn").text
    assert _selected(page, "gpu") == ["4GiB"]
    assert "whole GPU" not in page and "8GiB" not in page
    assert 'class="form-select"' in page
    # Under isolation none (the Platform helper's), the form says in one sentence what that means.
    assert "run as the same account and can read each other's files" in page


def test_from_the_form_a_busy_size_waits_in_line_and_a_size_never_granted_is_refused_in_its_words(
    school: Platform,
) -> None:
    tom = school.login("tom")
    assert tom.api("POST", "/users/tom/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    tom.wait_ready("tom")
    sam = school.login("sam")
    sam.get(f"{school.url}/hub/spawn")
    # 1 GiB of the class's budget is left: 2 GiB from the form waits in line for it (no refusal to read
    # first, never a server without a GPU in its place): the spawn page, pending.
    waiting = sam.post(f"{school.url}/hub/spawn", data={"gpu": "2GiB", "image": "default", "_xsrf": sam.xsrf()})
    assert waiting.status_code == 200 and waiting.url.endswith("/hub/spawn-pending/sam"), waiting.url
    assert sam.api("GET", "/users/sam").json()["servers"][""]["pending"] == "spawn"
    assert sam.api("DELETE", "/users/sam/server").status_code in (202, 204)  # leaves the line
    deadline = time.monotonic() + 30
    while sam.api("GET", "/users/sam").json()["servers"] and time.monotonic() < deadline:
        time.sleep(0.2)
    sam.get(f"{school.url}/hub/spawn")
    refused = sam.post(f"{school.url}/hub/spawn", data={"gpu": "8GiB", "image": "default", "_xsrf": sam.xsrf()})
    assert refused.status_code == 403
    assert "allows slices up to 4 GiB; you asked for 8 GiB. Ask for 4 GiB or less." in _error(refused.text)
    assert _selected(refused.text, "gpu") == ["4GiB"]  # the class's own slice chosen again
    # The API's words (gpu_memory, gpus=) never reach the form's page.
    both = sam.post(
        f"{school.url}/hub/spawn",
        data={"gpu_memory": "1GiB", "gpus": "1", "image": "default", "_xsrf": sam.xsrf()},
    )
    message = _error(both.text)
    assert "slice of one GPU" in message and "gpu_memory" not in message and "gpus=" not in message, message
    assert tom.api("DELETE", "/users/tom/server").status_code in (202, 204)


def _progress_events(session: Session, url: str) -> list[dict[str, Any]]:
    """The spawn's progress stream, read from the moment the spawn is pending (as the spawn page does)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with session.get(url, stream=True, timeout=90) as stream:
            lines = stream.iter_lines(decode_unicode=True) if stream.status_code == 200 else []
            events = [json.loads(line.removeprefix("data:")) for line in lines if line.startswith("data:")]
        if events and not events[0].get("failed"):
            return events
        time.sleep(0.02)  # not pending yet: the POST has not reached the spawner
    raise AssertionError("the spawn never became pending")


def test_the_progress_shows_each_stage_with_its_time_and_the_warning_once(school: Platform) -> None:
    uma = school.login("uma")
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(uma.api, "POST", "/users/uma/server", json={"gpu_memory": "1GiB"})
        events = _progress_events(uma, f"{school.url}/hub/api/users/uma/server/progress")
        assert posted.result().status_code in (201, 202)
    stages = [(e["progress"], e["message"]) for e in events]
    assert [p for p, _ in stages] == [0, 10, 20, 20, 35, 50, 70, 90, 100], stages  # 0 and 100: JupyterHub's
    for _, message in stages[1:-1]:
        assert re.search(r"\(\d+\.\d s\)$", message) or NO_ISOLATION in message, message
    assert "GPU placed: 1 GiB of GPU" in stages[2][1] and "home folder ready" in stages[4][1]
    assert "server process started (pid" in stages[6][1] and "server answering" in stages[7][1]
    assert sum(NO_ISOLATION in m for _, m in stages) == 1
    assert uma.api("DELETE", "/users/uma/server").status_code in (202, 204)
