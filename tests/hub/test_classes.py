from pathlib import Path

import pytest
import yaml

from hub.accounts import AccountsError, has_password, invites_path, passwords_path, redeem_invite
from hub.cli import main
from hub.settings import load
from spawner.quotas import GroupRules


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default data_dir (the invite codes' store) is relative to here


def test_new_members_get_an_invite_code_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "gpuslice.yaml"
    roster = tmp_path / "r.csv"
    roster.write_text("carol\ndave\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    printed = capsys.readouterr().out
    codes = dict(line.split(",") for line in printed.splitlines() if "," in line and " " not in line)
    assert set(codes) == {"carol", "dave"} and all(len(code) >= 16 for code in codes.values())
    data = tmp_path / "gpuslice-data"
    assert has_password(invites_path(data), "carol") and not has_password(passwords_path(data), "carol")
    roster.write_text("carol\ndave\nerin\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    again = capsys.readouterr().out
    assert "erin," in again and "carol," not in again  # a waiting code is never replaced


def test_an_invite_code_works_once_and_only_for_its_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings, roster = tmp_path / "gpuslice.yaml", tmp_path / "r.csv"
    roster.write_text("carol\ndave\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    codes = dict(line.split(",") for line in capsys.readouterr().out.splitlines() if "," in line and " " not in line)
    data = tmp_path / "gpuslice-data"
    with pytest.raises(AccountsError, match="does not open this name"):
        redeem_invite(data, "dave", codes["carol"], "dave-took-carols-code")  # another member's code
    with pytest.raises(AccountsError, match="at least 7 characters"):
        redeem_invite(data, "carol", codes["carol"], "short")
    redeem_invite(data, "carol", codes["carol"], "carols-own-password")
    with pytest.raises(AccountsError, match="does not open this name"):
        redeem_invite(data, "carol", codes["carol"], "a-strangers-password")  # spent
    with pytest.raises(AccountsError, match="does not open this name"):
        redeem_invite(data, "erin", "anything-at-all", "a-strangers-password")  # never invited
    assert not has_password(invites_path(data), "carol") and has_password(invites_path(data), "dave")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    assert "carol," not in capsys.readouterr().out  # joined: no new code


def test_class_add_writes_the_group_and_keeps_other_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = tmp_path / "gpuslice.yaml"
    settings.write_text("port: 9000\nadmin_users: [teacher]\n")
    roster = tmp_path / "roster.csv"
    roster.write_text("username,full name\nAlice,Alice A\nbob,Bob B\n\nalice,dup\n")
    code = main(
        [
            "class",
            "add",
            "ml101",
            str(roster),
            "--config",
            str(settings),
            "--max-slice",
            "4GiB",
            "--budget",
            "40GiB",
            "--servers-per-user",
            "1",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "class ml101: 2 students" in capsys.readouterr().out
    loaded = load(settings)
    assert loaded.port == 9000 and loaded.admin_users == ("teacher",)
    assert loaded.groups == (
        GroupRules(name="ml101", max_slice="4GiB", budget="40GiB", servers_per_user=1, members=("alice", "bob")),
    )


def test_roster_without_header_and_updating_a_class(tmp_path: Path) -> None:
    settings = tmp_path / "gpuslice.yaml"
    roster = tmp_path / "r.csv"
    roster.write_text("carol\ndave\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings), "--budget", "8GiB"]) == 0
    roster.write_text("erin\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    group = yaml.safe_load(settings.read_text())["groups"]["ml101"]
    assert group == {"budget": "8GiB", "members": ["erin"]}


@pytest.mark.parametrize(
    ("roster", "args", "message"),
    [
        ("username\nal ice\n", [], "r.csv:2: 'al ice' is not a user name"),
        ("", [], "the roster is empty"),
        ("username\n", [], "the roster names nobody"),
        ("bob\n", ["--max-slice", "lots"], "groups.ml101.max_slice"),
    ],
)
def test_bad_rosters_and_rules_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], roster: str, args: list[str], message: str
) -> None:
    settings = tmp_path / "gpuslice.yaml"
    settings.write_text("port: 9000\n")
    path = tmp_path / "r.csv"
    path.write_text(roster)
    assert main(["class", "add", "ml101", str(path), "--config", str(settings), *args]) == 2
    assert message in capsys.readouterr().err
    assert settings.read_text() == "port: 9000\n"


def test_class_add_keeps_the_files_comments_and_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "gpuslice.yaml"
    original = (
        "# Our lab's platform: ask Dana before changing ports\n"
        "port: 9000  # the firewall opens this one\n"
        "groups:\n"
        "  # the autumn class\n"
        "  ml100:\n"
        "    members: [zoe]\n"
    )
    settings.write_text(original)
    roster = tmp_path / "r.csv"
    roster.write_text("alice\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings), "--budget", "8GiB"]) == 0
    text = settings.read_text()
    for comment in ("# Our lab's platform", "# the firewall opens this one", "# the autumn class"):
        assert comment in text
    assert text.index("ml100") < text.index("ml101")
    assert load(settings).groups[1] == GroupRules(name="ml101", budget="8GiB", members=("alice",))


def test_a_size_without_its_unit_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "gpuslice.yaml"
    roster = tmp_path / "r.csv"
    roster.write_text("alice\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings), "--budget", "8"]) == 2
    assert "--budget 8: give the size with its unit, for example 8GiB" in capsys.readouterr().err
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings), "--max-hold", "2"]) == 2
    assert "--max-hold 2: give the duration with its unit, for example 2h" in capsys.readouterr().err
    assert not settings.exists()  # nothing written


def test_without_config_it_writes_where_gpuslice_up_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hub.settings import config_path

    monkeypatch.chdir(tmp_path)
    assert config_path(None) is None  # no file yet: the defaults
    (tmp_path / "r.csv").write_text("alice\n")
    assert main(["class", "add", "ml101", "r.csv", "--max-slice", "4GiB"]) == 0
    out = capsys.readouterr().out
    assert f"written to {tmp_path / 'gpuslice.yaml'}; `gpuslice up` run in this folder reads it" in out
    found = config_path(None)  # what `gpuslice up` without --config loads
    assert found is not None and load(found).groups[0].members == ("alice",)


def test_a_lost_code_is_renewed_and_the_old_one_stops_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, roster = tmp_path / "gpuslice.yaml", tmp_path / "r.csv"
    roster.write_text("carol\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    lost = dict(line.split(",") for line in capsys.readouterr().out.splitlines() if "," in line and " " not in line)
    assert main(["user", "invite", "--config", str(settings)]) == 0
    assert "carol," not in capsys.readouterr().out  # a waiting code is kept unless asked
    assert main(["user", "invite", "carol", "--renew", "--config", str(settings)]) == 0
    new = dict(line.split(",") for line in capsys.readouterr().out.splitlines() if "," in line and " " not in line)
    data = tmp_path / "gpuslice-data"
    with pytest.raises(AccountsError, match="does not open this name"):
        redeem_invite(data, "carol", lost["carol"], "a-strangers-password")
    redeem_invite(data, "carol", new["carol"], "carols-own-password")
    assert main(["user", "invite", "carol", "--renew", "--config", str(settings)]) == 0
    assert "carol," not in capsys.readouterr().out  # joined: a password is never replaced by a code


def test_a_new_class_leaves_the_comment_before_the_next_key_where_it_was(tmp_path: Path) -> None:
    settings = tmp_path / "gpuslice.yaml"
    settings.write_text(
        "groups:\n  ml101:\n    members: [zoe]\n    max_slice: 4GiB\n# where alerts go\nmonitoring:\n  enabled: false\n"
    )
    roster = tmp_path / "r.csv"
    roster.write_text("alice\n")
    assert main(["class", "add", "cv202", str(roster), "--config", str(settings), "--teachers", "Tina, tom"]) == 0
    text = settings.read_text()
    assert text.index("cv202") < text.index("# where alerts go") < text.index("monitoring:"), text
    assert load(settings).groups[1] == GroupRules(name="cv202", teachers=("tina", "tom"), members=("alice",))
    assert main(["class", "remove", "cv202", "--config", str(settings)]) == 0
    text = settings.read_text()
    assert "cv202" not in text and text.index("ml101") < text.index("# where alerts go") < text.index("monitoring:")


@pytest.mark.process  # asks a port where no hub listens
def test_without_a_running_hub_the_class_waits_in_the_file_for_the_next_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hub.classes import tell_running_hub
    from hub.settings import from_mapping

    settings = from_mapping({"data_dir": str(tmp_path / "data"), "hub_port": 9}, "t")
    assert "no hub has run" in tell_running_hub(settings, {"action": "remove-class", "name": "x"})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gpuslice-cli-hub-token").write_text("t")
    assert "no hub is running now" in tell_running_hub(settings, {"action": "remove-class", "name": "x"}, 2)


def test_teachers_from_the_option_or_the_roster_get_invite_codes_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, roster = tmp_path / "gpuslice.yaml", tmp_path / "r.csv"
    roster.write_text("username,role\ncarol,student\nTom,Teacher\ndave,\n")
    args = ["--teachers", "tina, tom", "--max-hold", "2h"]
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings), *args]) == 0
    printed = capsys.readouterr().out
    assert "class ml101: 2 students and 2 teachers" in printed
    codes = dict(line.split(",") for line in printed.splitlines() if "," in line and " " not in line)
    assert set(codes) == {"carol", "dave", "tom", "tina"}  # a teacher's name is never left to be claimed
    group = load(settings).groups[0]
    assert group.members == ("carol", "dave") and group.teachers == ("tom", "tina")
    assert group.quota.max_hold_s == 7200
    roster.write_text("carol\n")
    assert main(["class", "add", "ml101", str(roster), "--config", str(settings)]) == 0
    assert load(settings).groups[0].teachers == ("tom", "tina")  # no teachers given: those written are kept


@pytest.mark.parametrize(
    ("roster", "args", "message"),
    [
        ("username\ntess\u0430\n", [], "r.csv:2: 'tessа' is not a user name: The user name 'tess\\u0430' has 'а'"),
        ("carol\n", ["--teachers", "tina\u200b"], "--teachers: 'tina\\u200b' is not a user name"),
    ],
)
def test_a_look_alike_name_in_a_roster_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], roster: str, args: list[str], message: str
) -> None:
    settings, path = tmp_path / "gpuslice.yaml", tmp_path / "r.csv"
    path.write_text(roster)
    assert main(["class", "add", "ml101", str(path), "--config", str(settings), *args]) == 2
    assert message in capsys.readouterr().err
    assert not settings.exists()
