"""`gpuslice up`: run the single-machine platform in the foreground, or as the installed service.

Starts JupyterHub (which starts configurable-http-proxy, the idle culler and the
notebook servers) with hub/jupyterhub_config.py and the monitoring processes (kept
running by hub/supervise.py), prints the URLs once the hub answers, and on
SIGINT/SIGTERM stops it, and with it every child and every notebook server, those a
restarted hub adopted and any it lost track of included (hub/recovery.py). Before the
hub starts, servers left by a hub that is gone and that no hub claims are stopped.

``--service`` is what the installed hub unit runs (hub/service_units.py): the monitoring
processes are units of their own there, and a stop (systemd's SIGTERM: ``systemctl
restart``, ``gpuslice reload``, ``gpuslice upgrade``) leaves every server running in its
scope for the next start to adopt; only ``gpuslice stop --all`` and ``gpuslice uninstall``
end them (hub/service.py). Nothing secret is printed there: the journal keeps what it says.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

import yaml

from hub import monitoring, recovery, state, userenv
from hub.accounts import (
    AccountsError,
    admins_without_password,
    ensure_admin_passwords,
    service_token_file,
    signup_words,
    write_private,
)
from hub.exporter import default_hostname
from hub.settings import Settings, market_url, models_root
from hub.supervise import Child, Supervisor
from market import seeding
from market.store import Store
from spawner import confinement, environ
from spawner.cgroups import parse_settings_limits
from spawner.gpus import machine
from spawner.ledger import Ledger
from spawner.shares import format_bytes

REPO = Path(__file__).resolve().parents[1]
CONFIG = Path(__file__).with_name("jupyterhub_config.py")
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


class PlatformError(RuntimeError):
    """The platform cannot start; the message says what to do."""


SERVICE_STOP = (
    "Runs as a service: `gpuslice stop` stops it and leaves the notebook servers running, "
    "`gpuslice stop --all` ends them too."
)


def hub_command() -> list[str]:
    return [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)]


# One sentence, the same on the spawn form (spawner/form.py SHARED_ACCOUNT_WARNING).
ROOT_WARNING = (
    "gpuslice: WARNING: isolation is none, so everyone's notebooks run as the same account (root) and can "
    "read each other's files and the platform's secrets; for a class remove isolation: none from the "
    "settings (the default as root is an account per user, docs/security.md)."
)


def prepare(settings: Settings, config_path: Path | None) -> tuple[Path, dict[str, str]]:
    """Check prerequisites, make the data folder, reconcile the ledger; return (data_dir, env)."""
    if not PROXY.exists():
        raise PlatformError(f"configurable-http-proxy is not installed at {PROXY}; run scripts/setup (it runs npm ci).")
    data_dir = settings.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The hub's database, cookie secret, passwords, tokens, ledger and markets live here: only
    # the platform's account may enter, whoever made the folder and whatever the umask was.
    data_dir.chmod(0o700)
    if (data_dir / "jupyterhub.sqlite").exists():  # a platform that ran before, maybe under an older release
        state.upgrade(data_dir, config_path, market_url(settings.model_copy(update={"data_dir": data_dir})))
    ledger, hub_db = Ledger(data_dir / "ledger.sqlite"), data_dir / "jupyterhub.sqlite"
    confined = confinement.for_machine(data_dir)
    dropped = recovery.reconcile(ledger, hub_db, confinement=confined)
    for hold in dropped:
        print(f"gpuslice: released {hold.memory_bytes} bytes on GPU {hold.gpu_index} held by {hold.key} (not running)")
    print(confinement_line(confined, settings), flush=True)
    url, models = prepare_market(settings.model_copy(update={"data_dir": data_dir}))
    if settings.isolation == "unix-users":
        prepare_user_env(settings.user_env)
    env = dict(os.environ)
    env[environ.SETTINGS.name] = str(config_path.absolute()) if config_path else ""
    env[environ.DATA_DIR.name] = str(data_dir)
    env[environ.MARKET_URL.name] = url
    env[environ.MODELS_ROOT.name] = str(models)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return data_dir, env


def confinement_line(confined: confinement.Confinement | None, settings: Settings) -> str:
    """What `gpuslice up` says once about the servers' limits (docs/security.md#limits-per-server)."""
    if confined is None:
        why = "gpuslice does not run as root" if os.geteuid() else "no usable cgroup filesystem or systemd"
        return f"gpuslice: notebook servers run without per-server limits (memory, processes, devices, /tmp): {why}."
    devices = "" if confined.enforces_devices else "; device rules need cgroup v1 or systemd, so cards are not fenced"
    limits = parse_settings_limits(settings.limits)[0].describe()
    return f"gpuslice: each notebook server runs in a cgroup of its own ({confined.kind}): {limits}{devices}."


def prepare_user_env(prefix: Path) -> None:
    """The Python environment every user's account can run (hub/userenv.py), built once."""
    if userenv.wanted_stamp() != userenv.current_stamp(prefix):
        print(f"gpuslice: making the users' Python environment in {prefix} (once; about a minute)", flush=True)
    try:
        userenv.ensure(prefix)
    except userenv.UserEnvError as exc:
        raise PlatformError(str(exc)) from None


def prepare_market(settings: Settings) -> tuple[str, Path]:
    """Migrate the market's database and seed it from the catalogs; report bad entries."""
    url, models = market_url(settings), models_root(settings)
    store = Store(url)
    store.migrate()
    result = seeding.seed(store, Path(settings.market.images_catalog), Path(settings.market.models_catalog), models)
    for problem in result.problems:
        print(f"gpuslice: catalog: {problem}")
    report = result.report
    print(
        f"gpuslice: market: {len(report.added)} added, {len(report.updated)} updated from the catalogs, "
        f"{len(report.kept)} kept as admins left them"
    )
    store.engine.dispose()
    return url, models


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def hub_token(data_dir: Path) -> Path:
    """The token Prometheus scrapes the hub's /hub/metrics with (read:metrics only)."""
    return service_token_file(data_dir, "prometheus")


def monitoring_ports(settings: Settings) -> monitoring.Ports:
    """Where the hub and each monitoring server listen, from the settings (foreground or installed)."""
    options = settings.monitoring
    return monitoring.Ports(
        settings.hub_port,
        options.exporter_port,
        options.prometheus_port,
        options.alertmanager_port,
        options.node_exporter_port,
    )


def monitoring_folder(data_dir: Path) -> Path:
    """Prometheus's, Alertmanager's and their password's folder in the data folder."""
    return data_dir / "monitoring"


def monitoring_password_path(data_dir: Path) -> Path:
    """Where gpuslice up keeps the monitoring password (0600), for whoever must present it."""
    return monitoring_folder(data_dir) / "web-password"


def monitoring_password(data_dir: Path) -> Path:
    """The monitoring password in a 0600 file, and the web config (bcrypt hash) Prometheus and
    Alertmanager read; made once, kept across restarts."""
    path = monitoring_password_path(data_dir)
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24))
    write_private(path.parent / "web.yml", yaml.safe_dump(monitoring.web_config(path.read_text().strip())))
    return path


def monitoring_secrets(settings: Settings, data_dir: Path, env: dict[str, str]) -> Path | None:
    """The monitoring password (made once) named in the hub's environment, and the incident recorder's
    webhook token where Alertmanager is installed; None when monitoring is off."""
    if not settings.monitoring.enabled:
        return None
    folder = monitoring_folder(data_dir)
    folder.mkdir(exist_ok=True, mode=0o700)
    password_file = monitoring_password(data_dir)
    env[environ.MONITORING_PASSWORD_FILE.name] = str(password_file)
    if monitoring.binaries()["alertmanager"]:
        monitoring.local_recorder(folder, settings.monitoring.recorder_port)  # the hub runs the recorder
    return password_file


def monitoring_children(settings: Settings, data_dir: Path, env: dict[str, str]) -> list[Child]:
    """The exporter, and Prometheus, Alertmanager and node-exporter when installed (not started)."""
    options = settings.monitoring
    password_file = monitoring_secrets(settings, data_dir, env)
    if password_file is None:
        print("gpuslice: monitoring is off (monitoring.enabled is false in the settings).")
        return []
    folder = monitoring_folder(data_dir)
    found = monitoring.binaries()
    ports = monitoring_ports(settings)
    exporter = [
        sys.executable,
        "-m",
        "hub.cli",
        "exporter",
        "--port",
        str(ports.exporter),
        "--simulate",
        settings.simulate,
        "--ledger",
        str(data_dir / "ledger.sqlite"),
        "--faults",
        str(folder / "faults.json"),
        "--password-file",  # its per-process series name users' processes: not for students
        str(password_file),
    ]
    commands: dict[str, list[str]] = {"exporter": exporter}
    missing = [name for name in ("prometheus", "alertmanager") if not found[name]]
    if missing:
        print(
            f"gpuslice: monitoring is off: {' and '.join(missing)} not installed "
            "(as root, scripts/setup installs them: apt-get install prometheus prometheus-alertmanager). "
            "GPU metrics are still served by the exporter."
        )
    else:
        node = bool(found["node_exporter"])
        config = monitoring.prometheus_config(
            ports,
            hub_token(data_dir),
            node_exporter=node,
            interval=options.scrape_interval,
            node=default_hostname(),
            password_file=password_file,
        )
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        monitoring.write_alertmanager_config(options, folder)
        commands["alertmanager"] = [
            str(found["alertmanager"]),
            f"--config.file={folder / 'alertmanager.yml'}",
            f"--storage.path={folder / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{ports.alertmanager}",
            f"--web.config.file={folder / 'web.yml'}",
            "--cluster.listen-address=",
        ]
        commands["prometheus"] = [
            str(found["prometheus"]),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{ports.prometheus}",
            f"--web.config.file={folder / 'web.yml'}",
        ]
        if node:
            commands["node_exporter"] = [
                str(found["node_exporter"]),
                f"--web.listen-address=127.0.0.1:{ports.node_exporter}",
                f"--web.config.file={folder / 'web.yml'}",  # the machine's figures: monitoring's password too
            ]
    return [Child(name, command, folder, env) for name, command in commands.items()]


def admin_passwords(settings: Settings, data_dir: Path, service: bool) -> dict[str, str]:
    """Every admin's first password: returns those made here, to print once. The service prints
    nothing secret (the journal keeps it): it names the command that gives an admin a password."""
    try:
        if service and not settings.admin_password_from:
            for name in admins_without_password(settings, data_dir):
                print(f"gpuslice: admin {name} has no password yet: `gpuslice user set-password {name}` prints one")
            return {}
        return ensure_admin_passwords(settings, data_dir)
    except AccountsError as exc:
        raise PlatformError(str(exc)) from None


def up(settings: Settings, config_path: Path | None, service: bool = False) -> int:
    data_dir, env = prepare(settings, config_path)
    generated = admin_passwords(settings, data_dir, service)
    gpus = machine(settings.simulate)
    env[environ.PROMETHEUS_TOKEN_FILE.name] = str(hub_token(data_dir))
    if service:
        # Servers outlive this hub (jupyterhub_config.py); the monitoring processes are units of their own.
        env[environ.SERVICE.name] = "systemd"
        monitoring_secrets(settings, data_dir, env)
        supervisor = Supervisor([])
    else:
        supervisor = Supervisor(monitoring_children(settings, data_dir, env))
    supervisor.start_all()
    proc = subprocess.Popen(hub_command(), cwd=data_dir, env=env)
    asked_to_stop = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal asked_to_stop
        asked_to_stop = True
        supervisor.terminate_all()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    base = f"http://127.0.0.1:{settings.port}"
    if settings.isolation == "none" and os.geteuid() == 0:
        print(ROOT_WARNING, flush=True)
    if wait_healthy(f"{base}/hub/health", proc):
        print(
            f"gpuslice is up.\n"
            f"  JupyterHub:  {base}/  ({signup_words(settings)})\n"
            + "".join(f"  admin {name}'s password (shown once): {code}\n" for name, code in generated.items())
            + f"  health:      {base}/hub/health\n"
            f"  GPUs:        {', '.join(f'{g.model} {format_bytes(g.memory_bytes)}' for g in gpus.gpus)}\n"
            f"               ({gpus.source})\n"
            f"  data folder: {data_dir}\n"
            + "".join(f"  {name}: http://127.0.0.1:{port}/\n" for name, port in _monitoring_urls(settings, supervisor))
            + (SERVICE_STOP if service else "Stop with Ctrl-C."),
            flush=True,
        )
    while proc.poll() is None:
        supervisor.tick()
        time.sleep(1)
    supervisor.terminate_all()
    supervisor.wait_all()
    if asked_to_stop and not service:
        # A full stop ends every server, those the hub lost track of included. A hub that
        # merely died (killed, crashed) leaves them for the next start to adopt or stop.
        ledger, confined = Ledger(data_dir / "ledger.sqlite"), confinement.for_machine(data_dir)
        recovery.stop_jobs(ledger)  # jobs outlive a hub, not the platform: back in line for the next start
        for hold in recovery.stop_servers(ledger, confinement=confined):
            print(f"gpuslice: released {hold.memory_bytes} bytes on GPU {hold.gpu_index} held by {hold.key} (stopped)")
    return proc.returncode


def _monitoring_urls(settings: Settings, supervisor: Supervisor) -> list[tuple[str, int]]:
    names = {child.name for child in supervisor.children}
    ports = settings.monitoring
    labels = {
        "exporter": ("GPU metrics", ports.exporter_port),
        "prometheus": ("Prometheus", ports.prometheus_port),
        "alertmanager": ("Alertmanager", ports.alertmanager_port),
    }
    return [(label, port) for name, (label, port) in labels.items() if name in names]
