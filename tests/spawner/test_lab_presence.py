"""spawner/lab/gpuslice_presence.py's bookkeeping of pages and input, on the server's own clock.

(On a real jupyter_server with a real JupyterLab page: tests/e2e/test_presence.py.)
"""

import asyncio
import importlib.util
from types import ModuleType, SimpleNamespace

from spawner.assets import LAB_DIR


def presence_module() -> ModuleType:
    """The extension as the notebook server loads it: a module beside its config, not one of our packages."""
    spec = importlib.util.spec_from_file_location("gpuslice_presence", LAB_DIR / "gpuslice_presence.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab = presence_module()


def test_a_page_is_open_while_it_beats_and_gone_after_three_missed_beats() -> None:
    watch = lab.Watch(beat_s=60)
    assert watch.beat("a", True, now=100.0) is True  # a page opened: the hub hears at once
    assert watch.open_pages(100.0 + 180) == {"a": 100.0}
    assert watch.open_pages(100.0 + 181) == {}  # the tab closed, the laptop asleep
    short = lab.Watch(beat_s=3)
    short.beat("a", False, now=0.0)
    assert short.open_pages(89.0) == {"a": 0.0}  # never under 90 s: background tabs beat once a minute


def test_the_report_gives_ages_on_the_servers_clock_and_no_time_of_the_pages() -> None:
    watch = lab.Watch(beat_s=30)
    assert watch.report(50.0, connections=0, busy=False) == {
        "pages": 0,
        "connections": 0,
        "busy": False,
        "input_s": None,
        "page_s": None,
    }
    watch.beat("a", True, now=100.0)
    watch.beat("b", False, now=110.0)
    assert watch.report(130.0, connections=2, busy=True) == {
        "pages": 2,
        "connections": 2,
        "busy": True,
        "input_s": 30.0,
        "page_s": 20.0,
    }


def test_input_after_a_quiet_spell_is_told_at_once_and_steady_input_waits_for_the_next_report() -> None:
    watch = lab.Watch(beat_s=30)
    watch.beat("a", True, now=0.0)
    watch.report(1.0, 0, False)  # the hub has heard of the input at 0
    assert watch.beat("a", True, now=20.0) is False  # it knows of input 20 s ago: the periodic report will do
    assert watch.beat("a", False, now=50.0) is False  # no input: nothing to hurry
    watch.report(51.0, 0, False)
    assert watch.beat("a", True, now=90.0) is True  # back after 70 s the hub may have taken for an absence


def test_a_pages_word_is_bounded() -> None:
    watch = lab.Watch(beat_s=30)
    for n in range(lab.PAGES_KEPT + 10):
        watch.beat(f"page-{n}", False, now=float(n))
    assert len(watch.beats) == lab.PAGES_KEPT and "page-0" not in watch.beats


def test_the_kernels_connections_and_a_busy_one_are_read_from_the_kernel_manager() -> None:
    models = {
        "k1": {"connections": 1, "execution_state": "idle"},
        "k2": {"connections": 2, "execution_state": "busy"},
    }

    def kernel_model(kernel_id: str) -> dict[str, object]:
        if kernel_id == "gone":
            raise KeyError(kernel_id)  # ended between the list and the look
        return models[kernel_id]

    manager = SimpleNamespace(list_kernel_ids=lambda: ["k1", "k2", "gone"], kernel_model=kernel_model)
    assert lab.kernels_now(manager) == (3, True)


def test_reports_go_to_the_hub_as_jupyterhub_names_it_and_only_under_jupyterhub() -> None:
    assert lab.hub_of({}) is None
    hub = lab.hub_of(
        {
            "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
            "JUPYTERHUB_API_TOKEN": "t",
            "JUPYTERHUB_USER": "ann",
            "JUPYTERHUB_SERVER_NAME": "",
        }
    )
    assert hub == {"api_url": "http://127.0.0.1:8081/hub/api", "token": "t", "user": "ann", "server": ""}
    assert lab.beat_seconds({"JUPYTERHUB_ACTIVITY_INTERVAL": "30"}) == 30.0
    assert lab.beat_seconds({}) == 300.0  # JupyterHub's own default


def test_a_page_that_says_it_closes_is_gone_at_once_and_its_closing_is_the_last_sight_of_it() -> None:
    watch = lab.Watch(beat_s=30)
    watch.beat("a", True, now=0.0)
    watch.beat("b", False, now=5.0)
    assert watch.beat("a", False, now=10.0, gone=True) is False  # b is still open
    assert watch.beat("b", False, now=20.0, gone=True) is True  # the last page closed: the hub hears at once
    assert watch.report(25.0, connections=0, busy=False)["pages"] == 0
    assert watch.report(25.0, connections=0, busy=False)["page_s"] == 5.0  # seen until it closed
    assert watch.beat("zz", False, now=30.0, gone=True) is False  # a page never seen: nothing to tell


def test_the_hubs_tls_files_are_those_jupyterhub_names_and_none_over_plain_http() -> None:
    internal_ssl = {
        "JUPYTERHUB_SSL_CLIENT_CA": "/etc/jupyterhub/ssl/notebooks-ca_trust.crt",
        "JUPYTERHUB_SSL_KEYFILE": "/etc/jupyterhub/ssl/ssl.key",
        "JUPYTERHUB_SSL_CERTFILE": "/etc/jupyterhub/ssl/ssl.crt",
    }
    assert lab.hub_tls(internal_ssl) == {
        "validate_cert": True,
        "ca_certs": "/etc/jupyterhub/ssl/notebooks-ca_trust.crt",
        "client_key": "/etc/jupyterhub/ssl/ssl.key",
        "client_cert": "/etc/jupyterhub/ssl/ssl.crt",
    }
    assert lab.hub_tls({"JUPYTERHUB_SSL_CLIENT_CA": ""}) == {"validate_cert": True}  # an empty one is no file


def test_the_reporter_leaves_jupyterhub_the_shared_client_it_configures_for_the_hub() -> None:
    """JupyterHub's single-user extension loads after this one, configures tornado's client with the hub's CA
    and asks for the event loop's shared client (jupyterhub/singleuser/extension.py, hub_http_client): a
    reporter that had taken that client first left JupyterHub one without the CA (KubeSpawner's
    test_spawn_internal_ssl: the server's hub check failed and it exited)."""
    from tornado.httpclient import AsyncHTTPClient

    hub = {"api_url": "https://hub:8081/hub/api", "token": "t", "user": "ann", "server": ""}
    tls = lab.hub_tls({"JUPYTERHUB_SSL_CLIENT_CA": "/ssl/ca.crt"})

    async def load_as_the_server_does() -> None:
        reporter = lab.Reporter(SimpleNamespace(), hub, lab.Watch(beat_s=30), tls)
        AsyncHTTPClient.configure(AsyncHTTPClient.configured_class(), defaults={"ca_certs": "/ssl/hub-ca.crt"})
        jupyterhubs = AsyncHTTPClient()
        assert jupyterhubs.defaults["ca_certs"] == "/ssl/hub-ca.crt"
        assert reporter.client is not jupyterhubs and reporter.client.defaults["ca_certs"] == "/ssl/ca.crt"
        reporter.client.close()

    saved = AsyncHTTPClient._save_configuration()
    try:
        asyncio.run(load_as_the_server_does())
    finally:
        AsyncHTTPClient._restore_configuration(saved)
