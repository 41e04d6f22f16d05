import os
import re
from pathlib import Path

import pytest

from hub.settings import DEFAULT_SIMULATE, Settings, SettingsError, from_mapping, load
from spawner.line_timeouts import GPU_LEFT_TIMEOUT_S, GPU_NO_INPUT_TIMEOUT_S, GPU_RELEASE_TIMEOUT_S
from spawner.quotas import GroupRules

REPO = Path(__file__).resolve().parents[2]


def test_defaults_without_a_file() -> None:
    assert load(None) == Settings()
    assert load(None).simulate == DEFAULT_SIMULATE


def test_the_example_file_loads() -> None:
    settings = load(REPO / "examples" / "gpuslice.yaml")
    assert settings.port == 8000
    assert settings.admin_users == ("teacher",)
    assert settings.simulate == "2x16GiB:T4,1x80GiB:H100"
    assert settings.data_dir == Path("gpuslice-data")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: 99999\n", "port must be a number from 1 to 65535"),
        ("port: true\n", "port must be a number"),
        ("admin_users: alice\n", "admin_users must be a list of user names"),
        ("gpus: [1]\n", "gpus must be a mapping"),
        ("gpus: {simulate: lots}\n", "gpus.simulate: GPU spec entry 'lots' is not COUNTxSIZE"),
        ("data_dir: 3\n", "data_dir must be a folder path"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("port: [\n", "not valid YAML"),
        ("trusted_proxies: [nginx]\n", "trusted_proxies must be addresses or networks: 'nginx' is neither"),
    ],
)
def test_bad_settings_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as error:
        load(path)
    assert str(error.value).startswith(str(path))
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "markets: {db: sqlite:///m.db}\n",
            "unknown key(s) markets (did you mean market?); use admin_password_from, admin_users,",
        ),
        ("prot: 8000\n", "unknown key(s) prot (did you mean port?)"),
        ("monitoring: {enabeld: false}\n", "monitoring: unknown key(s) enabeld (did you mean enabled?)"),
        ("market: {model_root: /m}\n", "market: unknown key(s) model_root (did you mean models_root?)"),
        ("groups: {ml101: {max_slices: 4GiB}}\n", "groups.ml101: unknown key(s) max_slices (did you mean max_slice?)"),
        ("colour: red\n", "unknown key(s) colour; use"),  # nothing close: no guess
        ("simulate: 1x16GiB\n", "unknown key(s) simulate; use"),  # a field the reader sets, not a key
    ],
)
def test_unknown_keys_are_refused_with_a_suggestion(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as error:
        load(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


def test_the_portal_ports_are_settings(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("portal_port: 9502\nstreamlit_port: 9503\n")
    assert (load(path).portal_port, load(path).streamlit_port) == (9502, 9503)
    assert (load(None).portal_port, load(None).streamlit_port) == (8502, 0)


def test_groups_images_and_platform_options(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "groups:\n  ml101: {members: [a, b], max_slice: 4GiB, budget: 40GiB, servers_per_user: 1, images: [torch]}\n"
        "images:\n  torch: {path: /opt/envs/torch, description: PyTorch}\n"
        "isolation: none\nidle_timeout: 600\ngpu_idle_timeout: 300\nopen_signup: false\nhub_port: 9081\n"
    )
    settings = load(path)
    assert settings.groups == (
        GroupRules(
            name="ml101", members=("a", "b"), max_slice="4GiB", budget="40GiB", servers_per_user=1, images=("torch",)
        ),
    )
    assert settings.images["torch"].model_dump() == {"path": "/opt/envs/torch", "description": "PyTorch"}
    assert (settings.idle_timeout, settings.open_signup, settings.hub_port) == (600, False, 9081)
    assert settings.smallest_slice == "256MiB"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("groups: {ml101: {max_slice: big}}\n", "groups.ml101.max_slice: 'big' is not an amount of memory"),
        ("groups: {ml101: {colour: red}}\n", "groups.ml101: unknown key(s) colour"),
        ("groups: {ml101: {servers_per_user: -1}}\n", "groups.ml101.servers_per_user must be a whole number"),
        ("groups: {ml101: {members: alice}}\n", "groups.ml101.members must be a list"),
        ("images: {torch: {description: x}}\n", "images.torch needs a path"),
        ("isolation: docker\n", "isolation must be one of none, unix-users"),
        ("idle_timeout: 0\n", "idle_timeout must be a whole number of seconds above 0"),
        ("line_max_wait: -5\n", "line_max_wait must be a whole number of seconds above 0"),
        ("concurrent_starts: -1\n", "concurrent_starts must be a whole number, 0 or more"),
        ("open_signup: yes-please\n", "open_signup must be true or false"),
        ("smallest_slice: 0MiB\n", "smallest_slice: '0MiB' is not an amount of memory above 0"),
        ('smallest_slice: "' + "9" * 5000 + 'GiB"\n', "5003 characters long"),
        ("smallest_slice: 256\n", "a int is not an amount of memory"),
    ],
)
def test_bad_platform_settings(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load(path)


def test_market_settings_and_their_defaults(tmp_path: Path) -> None:
    from hub.settings import market_url, models_root

    path = tmp_path / "s.yaml"
    path.write_text(f"data_dir: {tmp_path / 'data'}\nmarket: {{proposals_per_hour: 5}}\n")
    settings = load(path)
    assert market_url(settings) == f"sqlite:///{tmp_path / 'data' / 'market.sqlite'}"
    assert models_root(settings) == tmp_path / "data" / "models"
    assert settings.market.proposals_per_hour == 5
    assert settings.market.images_catalog.endswith("images/catalog.yaml")
    path.write_text("market: {url: 'postgresql://db/market', models_root: /srv/models}\n")
    assert market_url(load(path)) == "postgresql://db/market" and models_root(load(path)) == Path("/srv/models")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("market: [1]", "market must be a mapping"),
        ("market: {colour: red}", "market: unknown key(s) colour"),
        ("market: {url: 5}", "market.url must be text"),
        ("market: {proposals_per_hour: 0}", "proposals_per_hour must be a whole number"),
    ],
)
def test_bad_market_settings(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load(path)


def test_isolation_defaults_to_an_account_per_user_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, isolation none would run every notebook as root: it must be asked for by name."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert Settings().isolation == "unix-users"
    assert from_mapping({}, "test").isolation == "unix-users"
    assert from_mapping({"isolation": "none"}, "test").isolation == "none"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert Settings().isolation == "none"
    assert from_mapping({}, "test").isolation == "none"


def test_user_env_must_be_absolute() -> None:
    with pytest.raises(SettingsError, match="user_env must be an absolute folder path"):
        from_mapping({"user_env": "venvs/user"}, "test")


def test_a_gpu_idle_timeout_the_culler_would_beat_is_refused_on_one_machine_too(tmp_path: Path) -> None:
    """The rule the chart had alone: the culler would stop the idle server before the line could have it."""
    with pytest.raises(SettingsError, match=r"gpu_idle_timeout \(900 s\) must be below idle_timeout \(600 s\)"):
        from_mapping({"idle_timeout": 600}, "s.yaml")
    with pytest.raises(SettingsError, match="lower gpu_idle_timeout or raise idle_timeout"):
        from_mapping({"gpu_idle_timeout": 3600}, "s.yaml")
    assert from_mapping({"idle_timeout": 600, "gpu_idle_timeout": 599}, "s.yaml").gpu_idle_timeout == 599


def test_presence_timeouts_default_from_the_line_and_keep_their_order() -> None:
    settings = from_mapping({}, "s.yaml")
    assert (settings.gpu_left_timeout, settings.gpu_no_input_timeout, settings.gpu_release_timeout) == (
        GPU_LEFT_TIMEOUT_S,
        GPU_NO_INPUT_TIMEOUT_S,
        GPU_RELEASE_TIMEOUT_S,
    )
    assert from_mapping({"gpu_left_timeout": 300, "gpu_no_input_timeout": 300}, "s.yaml").gpu_left_timeout == 300


@pytest.mark.parametrize(
    "raw,says",
    [
        ({"gpu_left_timeout": 700}, r"gpu_no_input_timeout \(480 s\) must be at least gpu_left_timeout \(700 s\)"),
        ({"gpu_no_input_timeout": 900}, r"gpu_release_timeout \(600 s\) must be above gpu_no_input_timeout \(900 s\)"),
        ({"gpu_release_timeout": 3600}, r"gpu_release_timeout \(3600 s\) must be below idle_timeout \(3600 s\)"),
        ({"gpu_left_timeout": 0}, "gpu_left_timeout"),
    ],
)
def test_presence_timeouts_out_of_order_are_refused_saying_what_to_change(raw: dict[str, object], says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        from_mapping(raw, "s.yaml")


def test_a_short_idle_timeout_leaves_the_default_release_moot_not_wrong() -> None:
    """Set, a release the culler always beats is a mistake; by default it is simply not reached."""
    settings = from_mapping({"idle_timeout": 500, "gpu_idle_timeout": 300}, "s.yaml")
    assert settings.gpu_release_timeout == GPU_RELEASE_TIMEOUT_S >= settings.idle_timeout


@pytest.mark.parametrize(
    ("raw", "signup"),
    [
        ({}, True),  # nobody configured: anyone may sign up, as before
        ({"groups": {"ml101": {"members": ["ann"]}}}, False),  # a class: closed unless asked for
        ({"groups": {"ml101": {"members": ["ann"]}}, "open_signup": True}, True),  # an explicit choice wins
        ({"groups": {"ml101": {"members": ["ann"]}}, "open_signup": None}, False),  # null is unset
        ({"open_signup": False}, False),
        ({"groups": {"default": {"max_slice": "2GiB"}}}, True),  # the default rules are no class
    ],
)
def test_a_platform_with_a_class_defaults_to_closed_signup(raw: dict[str, object], signup: bool) -> None:
    settings = from_mapping(raw, "s.yaml")
    assert settings.open_signup is signup
    assert ("open_signup: true" in settings.signup_words()) is signup


def test_the_banner_says_why_signup_is_closed() -> None:
    closed = from_mapping({"groups": {"ml101": {"members": ["ann"]}}}, "s.yaml").signup_words()
    assert "nobody else can sign up" in closed and "the default with a class" in closed
    assert "default with a class" not in from_mapping({"open_signup": False}, "s.yaml").signup_words()


def test_the_default_rules_may_be_changed_by_a_group_named_default() -> None:
    settings = from_mapping({"groups": {"default": {"max_slice": "2GiB", "servers_per_user": 2}}}, "s.yaml")
    (rules,) = settings.groups
    assert (rules.name, rules.max_slice, rules.servers_per_user, rules.max_gpus, rules.budget) == (
        "default",
        "2GiB",
        2,
        0,  # what the file leaves out keeps the built-in default
        "16GiB",
    )
    with pytest.raises(SettingsError, match=r"groups\.default\.members must be empty"):
        from_mapping({"groups": {"default": {"members": ["kim"]}}}, "s.yaml")


def test_commands_find_the_folders_settings_then_the_installed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.settings import config_path

    monkeypatch.chdir(tmp_path)
    installed = tmp_path / "etc" / "gpuslice.yaml"
    assert config_path(None, installed) is None  # neither: the defaults
    installed.parent.mkdir()
    installed.write_text("port: 8000\n")
    assert config_path(None, installed) == installed  # `gpuslice top` on an installed machine
    (tmp_path / "gpuslice.yaml").write_text("port: 9000\n")
    assert config_path(None, installed) == Path("gpuslice.yaml")  # the folder's own first, as always
    assert config_path(tmp_path / "other.yaml", installed) == tmp_path / "other.yaml"
