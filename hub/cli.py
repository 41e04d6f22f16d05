"""The `gpuslice` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from hub import job_cli, patrol, service_cli, state_cli, top_cli
from hub import settings as settings_mod
from spawner import environ, sharing
from spawner.placement import POLICIES
from spawner.quotas import GroupRules
from spawner.words import counted


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuslice", description="GPU notebook platform with GPU slices.")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start the single-machine platform")
    up.add_argument(
        "--config",
        type=Path,
        help="settings file (YAML; default ./gpuslice.yaml where it exists, else the installed one); see examples/",
    )
    up.add_argument(
        "--service",
        action="store_true",
        help="as the installed service runs it (gpuslice install): a stop leaves the notebook servers running",
    )

    classes = commands.add_parser("class", help="manage classes (groups of students with GPU rules)")
    class_commands = classes.add_subparsers(dest="class_command", required=True)
    add = class_commands.add_parser("add", help="add or update a class from a roster CSV")
    add.add_argument("name", help="the class (group) name, for example ml101")
    add.add_argument("roster", type=Path, help="CSV with a 'username' column, or user names in the first column")
    add.add_argument(
        "--config",
        type=Path,
        default=settings_mod.DEFAULT_CONFIG,
        help="settings file to update (default ./gpuslice.yaml, which gpuslice up reads)",
    )
    add.add_argument("--max-slice", help='largest slice per server, for example "4GiB"')
    add.add_argument("--budget", help='GPU memory the whole class may hold at once, for example "40GiB"')
    add.add_argument("--servers-per-user", type=int, help="running servers per student")
    add.add_argument("--max-gpus", type=int, help="whole cards per server (0: none)")
    add.add_argument("--max-hold", help='while others wait, the longest one server holds its slice, e.g. "2h"')
    add.add_argument(
        "--teachers", help="the class's teachers, comma-separated (also: a roster 'role' column saying teacher)"
    )
    add.add_argument(
        "--invites", type=Path, help="write the new members' and teachers' invite codes to this file (mode 0600)"
    )
    remove = class_commands.add_parser("remove", help="take a class out (nobody's server stops)")
    remove.add_argument("name", help="the class (group) name")
    remove.add_argument(
        "--config",
        type=Path,
        default=settings_mod.DEFAULT_CONFIG,
        help="settings file to update (default ./gpuslice.yaml, which gpuslice up reads)",
    )

    users = commands.add_parser("user", help="manage accounts")
    user_commands = users.add_subparsers(dest="user_command", required=True)
    reset = user_commands.add_parser("set-password", help="set or reset a user's password (prints a new one)")
    reset.add_argument("name", help="the user name")
    reset.add_argument("--config", type=Path, help="settings file (its data_dir holds the passwords)")
    reset.add_argument("--password-file", type=Path, help="read the password from this file instead of making one")
    invite = user_commands.add_parser(
        "invite", help="give class members single-use invite codes for /hub/join (prints them once)"
    )
    invite.add_argument("names", nargs="*", help="user names (default: every class member without a password)")
    invite.add_argument("--config", type=Path, help="settings file (its classes and data_dir)")
    invite.add_argument("--renew", action="store_true", help="replace a code still waiting (the old one stops working)")
    for command in (reset, invite):
        command.add_argument(
            "--kube-values",
            type=Path,
            help=f"the chart's rendered values (default in the hub's pod: ${environ.KUBE_VALUES.name})",
        )

    exporter = commands.add_parser("exporter", help="serve GPU metrics (dcgm-exporter names) on /metrics")
    exporter.add_argument("--port", type=int, default=9400, help="port on 127.0.0.1 (default 9400)")
    exporter.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    exporter.add_argument("--simulate", help="GPU spec to simulate when NVML finds no GPU, e.g. 2x16GiB:T4")
    exporter.add_argument("--ledger", type=Path, help="the hub's ledger: simulated GPUs follow its slices")
    exporter.add_argument("--faults", type=Path, help="JSON list of faults to inject into simulated GPUs")
    exporter.add_argument(
        "--password-file", type=Path, help="ask for basic auth (user gpuslice) with the password in this 0600 file"
    )
    exporter.add_argument("--hostname", help=f"the Hostname label (default: ${environ.NODE_NAME.name} or localhost)")

    report = commands.add_parser("usage", help="GPU-hours allocated, used and held idle per user, class and week")
    report.add_argument("--config", type=Path, help="settings file: its classes and Prometheus port")
    report.add_argument("--prometheus", help="Prometheus URL (default: 127.0.0.1 and monitoring.prometheus_port)")
    report.add_argument("--weeks", type=int, default=4, help="weeks back from now (default 4)")
    report.add_argument("--step", type=int, default=300, help="seconds between samples (default 300)")
    report.add_argument("--csv", type=Path, help="also write the per-user rows to this CSV file")
    report.add_argument(
        "--notices", type=Path, help="write last week's notice to each idle holder into this folder (USER.txt)"
    )
    report.add_argument(
        "--send", action="store_true", help="also mail each notice through notice_mail's relay (with --notices)"
    )
    report.add_argument(
        "--min-idle", type=float, default=2.0, help="GPU-hours held idle in a week that earn a notice (default 2)"
    )

    oncall = commands.add_parser(
        "oncall-config", help="print the Alertmanager config of the chart's on-call values (monitoring.oncall)"
    )
    oncall.add_argument("--kube-values", type=Path, required=True, help="the chart's rendered values (hub ConfigMap)")
    oncall.add_argument("--webhook-url", help="where alerts go that no on-call route takes (default: nowhere)")
    oncall.add_argument(
        "--secret-dir",
        type=Path,
        help="the on-call Secret's keys as files (default: where the chart mounts them, /etc/gpuslice-oncall)",
    )
    oncall.add_argument("--recorder-url", help="the incident recorder's webhook (every alert is recorded there)")
    oncall.add_argument("--recorder-token-file", type=Path, help="its bearer token (with --recorder-url)")
    oncall.add_argument(
        "--write-secret",
        metavar="NAMESPACE/NAME",
        help="write the config into this Secret (the chart's daily CronJob) instead of printing it",
    )
    oncall.add_argument("--key", default="alertmanager.yaml", help="the Secret's key (default alertmanager.yaml)")

    ext = commands.add_parser("scheduler-extender", help="kube-scheduler extender (filter, prioritize, bind)")
    ext.add_argument("--port", type=int, default=8888, help="port (default 8888)")
    ext.add_argument(
        "--address", default="127.0.0.1", help="address (default 127.0.0.1: only kube-scheduler in the same pod)"
    )
    ext.add_argument("--backend", choices=sharing.names(extender=True), required=True, help="the GPU sharing backend")
    ext.add_argument("--policy", choices=POLICIES, default="default", help="placement policy (default: default)")
    ext.add_argument("--api-server", help="Kubernetes API URL (default: in-cluster, with the service account)")

    state_cli.add_commands(commands)  # backup, restore, upgrade
    service_cli.add_commands(commands)  # install, uninstall, reload, start, stop, status, logs
    top_cli.add_command(commands)
    job_cli.add_command(commands)
    patrol.add_command(commands)
    _plugin_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return _up(args.config, args.service)
    if args.command == "class":
        return _class_add(args) if args.class_command == "add" else _class_remove(args)
    if args.command == "user":
        return _invite(args) if args.user_command == "invite" else _set_password(args)
    if args.command == "exporter":
        return _exporter(args)
    if args.command == "usage":
        return _usage(args)
    if args.command == "scheduler-extender":
        return _scheduler_extender(args)
    if args.command == "oncall-config":
        return _oncall_config(args)
    if args.command == "top":
        return top_cli.run(args)
    if args.command == "job":
        return job_cli.run(args)
    if args.command == "patrol":
        return patrol.run(args)
    if args.command in state_cli.COMMANDS:
        return state_cli.run(args)
    if args.command in service_cli.COMMANDS:
        return service_cli.run(args)
    return int(args.run(args))  # a command a plugin registered (_plugin_commands)


# Commands from other packages (the benchmarks: bench/cli.py) register themselves under this
# entry-point group (pyproject.toml): the command never imports a package above it.
COMMANDS_GROUP = "gpuslice.commands"


def _plugin_commands(commands: Any) -> None:
    """Let each installed ``gpuslice.commands`` entry point add its subcommands (with a ``run`` default)."""
    for entry in entry_points(group=COMMANDS_GROUP):
        try:
            register = entry.load()
        except ModuleNotFoundError:  # its package is not in this install (the images carry no benchmarks)
            continue
        register(commands)


JOIN_WORDS = (
    "each member or teacher opens /hub/join and types their name, code and the password they choose; a code works once."
)


def _class_add(args: argparse.Namespace) -> int:
    from hub.accounts import invite_codes, write_private
    from hub.classes import HUB_HAS_IT, add_class, read_roster, tell_running_hub, user_names

    rules = {
        "max_slice": args.max_slice,
        "budget": args.budget,
        "servers_per_user": args.servers_per_user,
        "max_gpus": args.max_gpus,
        "max_hold": args.max_hold,
    }
    try:
        roster = read_roster(args.roster)
        named = user_names(args.teachers, "--teachers") if args.teachers else []
        teachers = list(dict.fromkeys([*roster.teachers, *named])) or None
        written_rules = add_class(args.config, args.name, roster.members, rules, teachers)
        settings = settings_mod.load(args.config)
        live = {k: v for k, v in written_rules.items() if k in LIVE_RULE_KEYS}
        change = {"action": "put-class", "name": args.name, "rules": live, "members": roster.members}
        told = tell_running_hub(settings, change)
    except settings_mod.SettingsError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    written = args.config.absolute()
    if told != HUB_HAS_IT:  # no hub runs: say how the file gets used
        if written == settings_mod.DEFAULT_CONFIG.absolute():
            told = "`gpuslice up` run in this folder reads it"
        else:
            told = f"start with `gpuslice up --config {written}` to apply it"
    who = counted(len(roster.members), "student") + (f" and {counted(len(teachers), 'teacher')}" if teachers else "")
    print(f"class {args.name}: {who} written to {written}; {told}.")
    codes = invite_codes(settings.data_dir, [*roster.members, *(teachers or [])])
    lines = "".join(f"{name},{code}\n" for name, code in codes.items())
    if args.invites and codes:
        write_private(args.invites, "username,invite_code\n" + lines)
        print(f"{len(codes)} invite codes written to {args.invites}; {JOIN_WORDS}")
    elif codes:
        print(f"Invite codes (shown once): {JOIN_WORDS}")
        print(lines, end="")
    return 0


# The rules a running hub takes from `class add` (hub/classes_api.py RULE_KEYS; members apart): max_hold
# is the reclaimer's, read at the hub's start.
LIVE_RULE_KEYS = ("max_slice", "budget", "servers_per_user", "max_gpus", "images", "teachers")


def _class_remove(args: argparse.Namespace) -> int:
    from hub.classes import remove_class, tell_running_hub

    try:
        removed = remove_class(args.config, args.name)
        told = tell_running_hub(settings_mod.load(args.config), {"action": "remove-class", "name": args.name})
    except settings_mod.SettingsError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    where = f"taken out of {args.config.absolute()}" if removed else f"not in {args.config.absolute()}"
    print(f"class {args.name}: {where}; {told}.")
    return 0


def _accounts(args: argparse.Namespace) -> tuple[Path, tuple[GroupRules, ...]]:
    """The data folder holding the passwords and invite codes, and the classes: from the chart's values
    (--kube-values, or environ.KUBE_VALUES in the hub's pod, where no settings file is found) or from the
    single-machine settings (--config, ./gpuslice.yaml, the installed one)."""
    from hub.kube_values import load_kube_values

    config = settings_mod.config_path(args.config)  # --config, ./gpuslice.yaml, the installed one
    kube_values = args.kube_values or (None if config else environ.read().get(environ.KUBE_VALUES) or None)
    if kube_values:
        values = load_kube_values(Path(kube_values))
        return values.data_dir, values.groups
    settings = settings_mod.load(config)
    return settings.data_dir, settings.groups


def _set_password(args: argparse.Namespace) -> int:
    from hub.accounts import AccountsError, new_code, passwords_path, set_password
    from hub.classes import user_name
    from hub.kube_values import KubeValuesError
    from hub.logins import forget_failures, logins_path

    try:
        name = user_name(args.name, "gpuslice user set-password")
        data_dir, _ = _accounts(args)
        password = args.password_file.read_text().strip() if args.password_file else new_code()
        set_password(passwords_path(data_dir), name, password)
        forget_failures(logins_path(data_dir), name)  # a lockout on the name ends with the reset
    except (settings_mod.SettingsError, KubeValuesError, AccountsError, OSError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    if args.password_file:
        print(f"{args.name}'s password is now the one in {args.password_file}.")
    else:
        print(f"{args.name}'s new password (shown once): {password}")
    return 0


def _invite(args: argparse.Namespace) -> int:
    from hub.accounts import AccountsError, invite_codes, roster_names
    from hub.classes import user_name
    from hub.kube_values import KubeValuesError

    try:
        data_dir, groups = _accounts(args)
        names = [user_name(n, "gpuslice user invite") for n in args.names] or sorted(roster_names((), groups))
        codes = invite_codes(data_dir, names, renew=args.renew)
    except (settings_mod.SettingsError, KubeValuesError, AccountsError, OSError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    if not codes:
        print("No new invite codes: every name has a password or a code waiting (--renew replaces a lost code).")
        return 0
    print(f"Invite codes (shown once): {JOIN_WORDS}")
    print("".join(f"{name},{code}\n" for name, code in codes.items()), end="")
    return 0


def _exporter(args: argparse.Namespace) -> int:
    from hub.exporter import GpuCollector, default_hostname, registry_for, serve, source_for

    try:
        source, name = source_for(args.simulate, args.ledger, args.faults)
    except ValueError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    collector = GpuCollector(source, name, args.hostname or default_hostname())
    print(f"gpuslice exporter: {name} GPUs on http://{args.address}:{args.port}/metrics", flush=True)
    password = args.password_file.read_text().strip() if args.password_file else None
    serve(registry_for(collector), args.port, args.address, password)
    return 0


def _scheduler_extender(args: argparse.Namespace) -> int:
    from hub.extender import RestKubeClient, serve

    try:
        client = RestKubeClient(args.api_server) if args.api_server else RestKubeClient.in_cluster()
    except (RuntimeError, OSError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    print(
        f"gpuslice scheduler-extender: {args.policy} on {args.backend}, http://{args.address}:{args.port}", flush=True
    )
    serve(client, sharing.backend(args.backend), args.policy, args.address, args.port)
    return 0


def _monitoring_auth(settings: settings_mod.Settings) -> tuple[str, str] | None:
    """gpuslice up's Prometheus asks for basic auth; its password is in the data folder (0600)."""
    from hub.platform import monitoring_password_path  # lazy, as `up`: the platform's imports are heavy

    path = monitoring_password_path(settings.data_dir)
    try:
        return (settings_mod.MONITORING_USER, path.read_text().strip())
    except OSError:  # another Prometheus (--prometheus URL) or monitoring never started here
        return None


def _oncall_config(args: argparse.Namespace) -> int:
    """On Kubernetes the cluster runs Alertmanager: this is the config to give it (a Secret, amtool)."""
    import yaml

    from hub.kube_values import KubeValuesError, load_kube_values, secrets_read_from
    from hub.monitoring import Recorder, alertmanager_config

    try:
        values = load_kube_values(args.kube_values)
    except KubeValuesError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    oncall = secrets_read_from(values.oncall, args.secret_dir) if args.secret_dir else values.oncall
    recorder = None
    if args.recorder_url:
        if not args.recorder_token_file:
            print("gpuslice: --recorder-url needs --recorder-token-file (its webhook is never open)", file=sys.stderr)
            return 2
        # The cluster's Alertmanager cannot read our files: the token goes into its config Secret itself.
        token = args.recorder_token_file.read_text().strip()
        recorder = Recorder(args.recorder_url, credentials=token)
    try:
        config = alertmanager_config(args.webhook_url, oncall, recorder=recorder)
    except settings_mod.SettingsError as exc:  # a webhook URL's file (the on-call Secret's key) missing or empty
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(config, sort_keys=False)
    if not args.write_secret:
        print(text, end="")
        return 0
    from hub.alertmanager_secret import Kube, SecretWriteError, write_config

    namespace, _, name = args.write_secret.partition("/")
    if not (namespace and name):
        print("gpuslice: --write-secret takes NAMESPACE/NAME", file=sys.stderr)
        return 2
    try:
        changed = write_config(Kube.in_cluster(), namespace, name, args.key, text)
    except SecretWriteError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 1
    print(
        f"gpuslice: the Alertmanager config in {namespace}/{name} ({args.key}) {'renewed' if changed else 'unchanged'}"
    )
    return 0


def write_notices(notices: Mapping[str, str], folder: Path) -> list[Path]:
    """One file per user (``USER.txt``) in ``folder``, for a mailer or the hub's announcements to send."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for user, text in sorted(notices.items()):
        if not user or "/" in user or user.startswith("."):
            raise ValueError(f"cannot write a notice for the user name {user!r}: it is not a plain file name")
        path = folder / f"{user}.txt"
        path.write_text(text)
        written.append(path)
    return written


def _usage(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from prometheus_api_client import PrometheusConnect

    from spawner import usage

    try:
        settings = settings_mod.load(args.config)
    except settings_mod.SettingsError as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2
    if args.send and not (args.notices and settings.notice_mail):
        print(
            "gpuslice: --send needs --notices FOLDER and notice_mail (smtp_smarthost, smtp_from) in the settings",
            file=sys.stderr,
        )
        return 2
    url = args.prometheus or f"http://127.0.0.1:{settings.monitoring.prometheus_port}"
    end = datetime.now(UTC)
    try:
        query = PrometheusConnect(url, auth=_monitoring_auth(settings)).custom_query_range
        samples = usage.samples_from_prometheus(query, end - timedelta(weeks=args.weeks), end, args.step)
    except Exception as exc:  # the client raises its own and requests' errors: say which server failed
        print(
            f"gpuslice: Prometheus at {url} did not answer ({type(exc).__name__}); is gpuslice up running?",
            file=sys.stderr,
        )
        return 1
    rows = usage.usage(samples, args.step, usage.group_members(settings.groups))
    print(usage.to_csv([*rows, *usage.by_group(rows)]), end="")
    for week, allocated, used in usage.trend(rows):
        worst = ", ".join(f"{r.user} {r.idle_h:.1f} h" for r in usage.worst_holders(rows, week, 3))
        print(f"# {week}: {allocated:.1f} GPU-hours allocated, {used:.1f} used; most idle-held: {worst or 'none'}")
    if args.csv:
        args.csv.write_text(usage.to_csv(rows))
    if args.notices:
        last_week = usage.iso_week((end - timedelta(weeks=1)).timestamp())
        notices = usage.idle_notices(rows, last_week, args.min_idle)
        written = write_notices(notices, args.notices / last_week)
        print(f"# {len(written)} notices for {last_week} in {args.notices / last_week}")
        if args.send and settings.notice_mail:
            return _mail_notices(notices, last_week, settings.notice_mail)
    return 0


def _mail_notices(notices: dict[str, str], week: str, relay: settings_mod.NoticeMail) -> int:
    import smtplib

    from hub import mail

    host, port = relay.smtp_smarthost.rsplit(":", 1)
    try:
        with smtplib.SMTP(host, int(port), timeout=30) as smtp:
            mail.secure(smtp, relay)
            sent = mail.send_notices(notices, week, relay, smtp)
    except (OSError, RuntimeError) as exc:
        print(f"gpuslice: mailing the notices failed: {exc}", file=sys.stderr)
        return 1
    print(f"# {len(sent)} notices mailed through {relay.smtp_smarthost}")
    return 0


def _up(config: Path | None, service: bool) -> int:
    from hub.platform import PlatformError, up

    config = settings_mod.config_path(config)
    if config is not None:
        print(f"gpuslice: settings from {config.absolute()}", file=sys.stderr)
    try:
        settings = settings_mod.load(config)
        return up(settings, config, service)
    except (settings_mod.SettingsError, PlatformError) as exc:
        print(f"gpuslice: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
