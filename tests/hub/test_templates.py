"""The hub's pages with the GPU line's words (hub/templates), rendered as JupyterHub renders them:
its own templates under the "templates/" prefix, ours first, autoescape on. The pages in a
browser: tests/e2e/test_waiting_line.py and tests/e2e/test_class_flow.py."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from jupyterhub._data import DATA_FILES_PATH

HUB = Path(DATA_FILES_PATH) / "templates"  # JupyterHub's own, as it finds them
OURS = Path(__file__).parents[2] / "hub" / "templates"


def render(name: str, **context: Any) -> str:
    loader = ChoiceLoader(
        [PrefixLoader({"templates": FileSystemLoader([str(HUB)])}, "/"), FileSystemLoader([str(OURS), str(HUB)])]
    )
    env = Environment(loader=loader, autoescape=True)
    base = {"base_url": "/hub/", "static_url": lambda path, **kw: f"/hub/static/{path}", "user": None}
    return env.get_template(name).render(**{**base, **context})


class Spawner(SimpleNamespace):
    def gpu_line_place(self) -> str:
        return str(self.place)

    def gpu_reclaim_warning(self) -> tuple[str, float] | None:
        return self.warning  # type: ignore[no-any-return]

    def gpu_stop_reason(self) -> tuple[str, str] | None:
        return self.stopped  # type: ignore[no-any-return]


class Anything:
    """What else JupyterHub's page.html reads of a user (their server, their roles): nothing to show."""

    def __getattr__(self, name: str) -> "Anything":
        return Anything()

    def __call__(self, *args: object, **kwargs: object) -> "Anything":
        return Anything()

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __str__(self) -> str:
        return ""


class User(Anything):
    def __init__(self, spawner: Spawner) -> None:
        self.name, self.admin, self._spawner = "ann", False, spawner

    def all_spawners(self, include_default: bool = True) -> list[Spawner]:
        return [self._spawner]


def _user(spawner: Spawner) -> User:
    return User(spawner)


def test_the_waiting_page_says_the_place_offers_no_gpu_now_and_escapes_what_it_shows() -> None:
    waiting = Spawner(
        name="", place="Waiting in line for 4 GiB <b>. You are next in line.", user_options={"image": "x"}
    )
    page = render("spawn_pending.html", spawner=waiting, user=_user(waiting), progress_url="/p")
    assert "You are waiting in line for a GPU" in page
    assert "Waiting in line for 4 GiB &lt;b&gt;. You are next in line." in page  # escaped
    assert "Start without a GPU now instead" in page and 'var CHOSEN = {"image": "x"}' in page
    assert 'id="gpuslice-line" hidden' not in page  # shown at once: the first screen is the place
    starting = Spawner(name="", place="", user_options={})
    assert 'id="gpuslice-line" hidden' in render("spawn_pending.html", spawner=starting, user=_user(starting))


def test_the_home_page_shows_the_wait_or_why_the_server_stopped() -> None:
    waiting = Spawner(name="", active=True, place="You are next in line.", warning=None, stopped=None)
    page = render("home.html", user=_user(waiting), default_server=SimpleNamespace(active=True), url="/hub/spawn")
    assert "<strong>Your server:</strong>" in page and "You are next in line." in page and "Follow your place" in page
    stopped = Spawner(
        name="", active=False, place="", warning=None, stopped=("stopped by the GPU line's reclaimer: idle", "T")
    )
    page = render("home.html", user=_user(stopped), default_server=SimpleNamespace(active=False), url="/hub/spawn")
    assert "Your server stopped at" in page and "Stopped by the GPU line&#39;s reclaimer: idle." in page


def test_the_login_page_shows_a_new_student_the_way_in_with_their_invite_code() -> None:
    page = render("login.html", authenticator=Anything(), login_url="/hub/login", login_error="", username="")
    assert "New in a class? Choose your password with the invite code" in page
    assert '<a href="/hub/join">join your class</a>' in page
