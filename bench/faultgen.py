"""The alert replay's platform and its faults, drawn from published sources, never from the rules.

A 16-GPU platform (4 nodes of 4 A100) is simulated minute by minute in the metric names the
exporter and the hub really serve (dcgm-exporter's DCGM_FI_*, the hub's slice allocations,
the exporter's per-process memory, Prometheus' ``up``): healthy load on a daily pattern, and
faults. Each fault kind has several *shapes*, and each shape's parameters are drawn from
ranges taken from the sources in ``SOURCES`` (NVIDIA's Xid catalog and device plugin, DCGM's
and NVML's field definitions, NCCL's and PyTorch's documented defaults, the A100's limits,
published failure studies), or marked as an assumption where no source gives a number. The
shapes fall on both sides of where a rule could draw its line: a hang that NCCL's own
watchdog ends after ten minutes, a card whose SM activity is that of the 32 channels NCCL
spins on, a hardware Xid that Xid 45's cleanup overwrites a moment later.

This module never reads the alert rules (in hub/monitoring) nor imports what does:
tests/bench/test_faultgen.py checks it. Which alert each shape *should* raise is stated here
by name, for scoring (bench/alerts.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

STEP_MIN = 1  # one sample and one rule evaluation a minute: the replay's scrape interval
NODES = tuple(f"gpu-node-{n}" for n in range(1, 5))
GPUS_PER_NODE = 4
MODEL = "A100"
GiB = 1024**3
MiB = 1024**2
SLICE_BYTES = 10 * GiB
CARD_BYTES = 80 * GiB
IDLE_POWER_W, FULL_POWER_W = 50.0, 400.0

# Where each number below comes from. Shapes name these keys; "assumption" marks a number no source gives.
SOURCES = {
    "xid-catalog": "NVIDIA, Xid Errors: Analyzing Xid Errors with the Xid Catalog (docs.nvidia.com/deploy/"
    "xid-errors/analyzing-xid-catalog.html): per code its mnemonic, the GPUs it applies to and its resolution "
    "bucket; 45 is 'Preemptive cleanup, due to previous errors', emitted for the channels another failure hit; "
    "48 a double-bit ECC error; 79 'GPU has fallen off the bus'",
    "device-plugin": "NVIDIA k8s-device-plugin, internal/rm/health.go: the Xids it ignores as application "
    "errors ('the GPU should still be healthy'): 13, 31, 43, 45, 68, 109",
    "dcgm-fields": "DCGM / dcgm-exporter field definitions: DCGM_FI_DEV_XID_ERRORS 'Value of the last XID error "
    "encountered'; DCGM_FI_PROF_SM_ACTIVE 'The ratio of cycles an SM has at least 1 warp assigned'; "
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL volatile double-bit errors (reset when the driver reloads or the GPU resets)",
    "nvml-util": "NVML nvmlDeviceGetUtilizationRates: 'percent of time over the past sample period during "
    "which one or more kernels was executing on the GPU' (a kernel spinning in place counts as busy)",
    "a100": "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs; nvidia-smi -q on A100: GPU max "
    "operating temperature 85 C, slowdown 89-90 C, shutdown 92-95 C (the range across SXM4/PCIe boards)",
    "nccl": "NCCL environment variables (NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS): a collective runs on 1 to 32 "
    "channels, one thread block each; a hung collective's blocks spin on those SMs",
    "pytorch-nccl": "PyTorch torch.distributed.init_process_group: the NCCL watchdog aborts a collective after "
    "`timeout`, 10 minutes by default (30 minutes in releases before 2.2 and for other backends)",
    "llama3": "Dubey et al., The Llama 3 Herd of Models (2024), Table 5: of 419 unexpected interruptions in 54 "
    "days on 16,384 H100, 148 faulty GPU (incl. NVLink), 72 HBM3 memory, 19 SRAM, 17 GPU system processor, "
    "35 network switch or cable, 6 thermal interface and sensor, 7 NCCL watchdog timeouts",
    "delta": "Cui et al., Characterizing GPU Resilience and Impact on AI/HPC Systems (2025, NCSA Delta, A100/H100, "
    "11.7 M GPU-hours): GSP (Xid 119/120) the most error-prone hardware part; NVLink errors (Xid 74) often "
    "retried without a job failure; uncorrectable memory errors (Xid 48/94/95) with row remapping (Xid 63/64)",
    "cuda-context": "Measured here: a PyTorch process holding 3 GiB showed 3.76e9 bytes in NVML on an H100 "
    "(docs/monitoring.md), the CUDA context and the allocator's workspace outside the framework's cap; "
    "CUDA documents the context as some hundreds of MiB depending on the GPU and driver",
    "assumption": "No source found: a plausible range, stated so that its result is read as such",
}

# Xid codes by who causes them. Application errors follow a user's program: NVIDIA's device plugin
# leaves the card in service for them. The hardware codes are the catalog's GPU, memory, NVLink and
# GSP failures (drain or reset the card).
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)  # device-plugin
HARDWARE_XIDS = (48, 62, 63, 64, 74, 92, 94, 95, 119, 120)  # xid-catalog, delta
CLEANUP_XID = 45  # xid-catalog: emitted after another failure, for the channels it took down


@dataclass(frozen=True)
class Shape:
    """One way a fault kind shows in the metrics, the alert it should raise (None: nothing should
    fire), the sources of its numbers, and why a rule may not see it."""

    name: str
    expect: str | None
    sources: tuple[str, ...]
    note: str = ""


# Each kind's alert, the other alerts it explains (they belong to its incident), and its shapes.
KINDS: dict[str, tuple[str, frozenset[str], tuple[Shape, ...]]] = {
    "xid_storm": (
        "GpuXidError",
        frozenset(),
        (
            Shape("hardware_xid", "GpuXidError", ("xid-catalog", "delta", "dcgm-fields")),
            Shape(
                "hardware_then_cleanup",
                "GpuXidError",
                ("xid-catalog", "device-plugin", "dcgm-fields"),
                "Xid 45 follows within the minute: the last Xid the exporter reports is an application's code",
            ),
            Shape(
                "fallen_off_bus",
                "GpuXidError",
                ("xid-catalog", "llama3"),
                "Xid 79: NVML cannot read the card, so its series stop; no Xid value is ever scraped",
            ),
        ),
    ),
    "ecc_double_bit": (
        "GpuEccDoubleBitErrors",
        frozenset({"GpuXidError"}),  # Xid 48 comes with it
        (
            Shape("single_dbe", "GpuEccDoubleBitErrors", ("xid-catalog", "dcgm-fields", "llama3")),
            Shape("dbe_burst", "GpuEccDoubleBitErrors", ("delta", "assumption")),
            Shape(
                "dbe_then_reset",
                "GpuEccDoubleBitErrors",
                ("dcgm-fields",),
                "the volatile counter goes back to 0 when the card is reset a few minutes later",
            ),
        ),
    ),
    "thermal_runaway": (
        "GpuTemperatureHigh",
        frozenset(),
        (
            Shape("cooling_failure", "GpuTemperatureHigh", ("a100", "llama3", "assumption")),
            Shape(
                "brief_excursion",
                "GpuTemperatureHigh",
                ("a100", "assumption"),
                "above the card's maximum operating temperature for 1-6 minutes only",
            ),
        ),
    ),
    "hung_gpu": (
        "GpuHung",
        frozenset(),
        (
            Shape("collective_hang", "GpuHung", ("nccl", "a100", "nvml-util", "pytorch-nccl", "llama3")),
            Shape(
                "spinning_kernel",
                "GpuHung",
                ("nvml-util", "dcgm-fields", "assumption"),
                "a deadlocked kernel spinning on every SM looks like full work in every metric the exporter has",
            ),
        ),
    ),
    "leaking_notebook": (
        "GpuMemoryOverSlice",
        frozenset(),
        (Shape("uncapped_leak", "GpuMemoryOverSlice", ("cuda-context", "assumption")),),
    ),
    "idle_slice_held": (
        "IdleGpuSlicesHeld",
        frozenset(),
        (
            Shape("idle", "IdleGpuSlicesHeld", ("nvml-util", "assumption")),
            Shape(
                "polled_idle",
                "IdleGpuSlicesHeld",
                ("nvml-util", "assumption"),
                "a progress bar or monitoring loop launches a tiny kernel now and then: some samples show 1-3%",
            ),
        ),
    ),
    "exporter_down": (
        "GpuExporterDown",
        frozenset(),
        (
            Shape("process_down", "GpuExporterDown", ("assumption",)),
            Shape("nvml_failing", "GpuExporterDown", ("assumption",)),
            Shape(
                "flapping",
                "GpuExporterDown",
                ("assumption",),
                "scrapes time out every second or third minute: never down for two minutes in a row",
            ),
        ),
    ),
    "node_down": (
        "NodeDown",
        frozenset({"GpuExporterDown"}),
        (
            Shape("down", "NodeDown", ("llama3", "assumption")),
            Shape("quick_reboot", "NodeDown", ("assumption",), "back within 1-3 minutes"),
        ),
    ),
}
FAULT_ALERTS: dict[str, tuple[str, frozenset[str]]] = {k: (a, x) for k, (a, x, _) in KINDS.items()}
NODE_FAULTS = {"exporter_down", "node_down"}
SESSION_FAULTS = {"hung_gpu", "leaking_notebook", "idle_slice_held"}  # need a server on the card
LONGEST_FAULT = 8 * 60


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str
    gpu: int | None
    start: int  # minute injected
    end: int  # minute it is over (exclusive)
    onset: int = -1  # minute it becomes observable in the metrics; set by the generator
    shape: str = ""
    params: tuple[tuple[str, float], ...] = ()  # the drawn parameters, for the report

    @property
    def alert(self) -> str:
        return FAULT_ALERTS[self.kind][0]

    @property
    def expect(self) -> str | None:
        return next(s.expect for s in KINDS[self.kind][2] if s.name == self.shape) if self.shape else self.alert

    def param(self, name: str) -> float:
        return dict(self.params)[name]


@dataclass
class Replay:
    minutes: int
    series: dict[str, list[float | None]]  # series selector -> value per minute (None: no sample)
    faults: list[Fault]
    servers: dict[str, tuple[str, int]] = field(default_factory=dict)  # user -> (node, gpu)


def draw_params(rng: random.Random, kind: str, shape: str) -> tuple[tuple[str, float], ...]:
    """A fault's shape in numbers, from the ranges its sources give (minutes, degrees, ratios)."""
    uniform, choice = rng.uniform, rng.choice
    p: dict[str, float] = {}
    if kind == "xid_storm":
        p["code"] = 79.0 if shape == "fallen_off_bus" else float(choice(HARDWARE_XIDS))
        p["minutes"] = round(uniform(15, 240))  # until someone resets the card (assumption)
    elif kind == "ecc_double_bit":
        p["errors"] = 1.0 if shape != "dbe_burst" else float(rng.randrange(2, 9))
        p["minutes"] = round(uniform(2, 30)) if shape == "dbe_then_reset" else round(uniform(30, 240))
    elif kind == "thermal_runaway":
        p["max_operating"] = 85.0  # a100
        p["slowdown"] = uniform(89, 90)  # a100: the clocks hold the card about here
        if shape == "cooling_failure":
            p["rise_per_min"] = uniform(0.3, 3.0)  # assumption: a fan or pump stops under load
            p["minutes"] = round(uniform(30, 180))
        else:
            p["over"] = uniform(0.5, 4.0)
            p["minutes"] = round(uniform(1, 6))
    elif kind == "hung_gpu":
        if shape == "collective_hang":
            p["sm_active"] = rng.randint(1, 32) / 108  # nccl channels over the A100's 108 SMs
            p["minutes"] = float(choice((10, 30, round(uniform(30, 240)))))  # pytorch-nccl watchdog, or none
        else:
            p["sm_active"] = uniform(0.8, 1.0)
            p["minutes"] = round(uniform(30, 240))
    elif kind == "leaking_notebook":
        p["mib_per_min"] = math.exp(uniform(math.log(8), math.log(512)))  # assumption: log-uniform 8-512
        p["minutes"] = round(uniform(60, 240))
    elif kind == "idle_slice_held":
        p["minutes"] = round(uniform(150, LONGEST_FAULT))
        if shape == "polled_idle":
            p["poll_every"] = float(rng.randint(2, 15))  # minutes between the loop's tiny kernels
    elif kind == "exporter_down":
        p["minutes"] = round(uniform(5, 90))
        if shape == "flapping":
            p["fail_ratio"] = uniform(0.3, 0.6)
    elif kind == "node_down":
        p["minutes"] = round(uniform(1, 3)) if shape == "quick_reboot" else round(uniform(5, 180))
    return tuple(sorted(p.items()))


def schedule_faults(
    rng: random.Random, minutes: int, per_shape: int, only: frozenset[tuple[str, str]] | None = None
) -> list[Fault]:
    """Each shape (of ``only``, when given) ``per_shape`` times at random times, never two at once on one node."""
    wanted = [
        (kind, s.name)
        for kind, (_, _, shapes) in KINDS.items()
        for s in shapes
        if only is None or (kind, s.name) in only
        for _ in range(per_shape)
    ]
    rng.shuffle(wanted)
    faults: list[Fault] = []
    busy: dict[str, list[tuple[int, int]]] = {node: [] for node in NODES}
    for kind, shape in wanted:
        params = draw_params(rng, kind, shape)
        length = int(dict(params)["minutes"])
        for _ in range(2000):
            node, gpu = rng.choice(NODES), rng.randrange(GPUS_PER_NODE)
            day = rng.randrange(max(1, minutes // 1440))
            # Faults that need a server happen in working hours; the others at any time.
            start = day * 1440 + (
                rng.randrange(9 * 60, 12 * 60) if kind in SESSION_FAULTS else rng.randrange(60, 1440 - 300)
            )
            end = start + length
            if end + 60 < minutes and all(end + 60 < s or start > e + 60 for s, e in busy[node]):
                busy[node].append((start, end))
                faults.append(Fault(kind, node, None if kind in NODE_FAULTS else gpu, start, end, -1, shape, params))
                break
        else:
            raise ValueError(f"cannot place {per_shape} faults of each shape in {minutes} minutes: replay longer")
    return sorted(faults, key=lambda f: f.start)


def load(minute: int) -> float:
    """The platform's daily pattern: quiet at night, a morning and an afternoon peak, quieter weekends."""
    hour = (minute % 1440) / 60
    weekend = (minute // 1440) % 7 >= 5
    day = math.exp(-(((hour - 11) / 2.0) ** 2)) + 0.8 * math.exp(-(((hour - 15.5) / 2.0) ** 2))
    return (0.4 if weekend else 1.0) * min(1.0, day)


def generate(
    seed: int, days: float, faults_per_kind: int = 1, only: frozenset[tuple[str, str]] | None = None
) -> Replay:
    """A replay with each fault shape (of ``only``) ``faults_per_kind`` times (0: a healthy platform)."""
    rng = random.Random(seed)
    minutes = int(days * 1440)
    faults = schedule_faults(rng, minutes, faults_per_kind, only)
    series: dict[str, list[float | None]] = {}
    servers: dict[str, tuple[str, int]] = {}
    for node in NODES:
        _node_series(series, node, minutes)
        for gpu in range(GPUS_PER_NODE):
            user = f"user-{node[-1]}{gpu}"
            servers[user] = (node, gpu)
            _gpu_series(rng, series, node, gpu, user, minutes, faults)
    for job in ("jupyterhub", "alertmanager", "prometheus"):
        series[f'up{{job="{job}",instance="hub:{job}"}}'] = [1.0] * minutes
    for f in faults:
        if f.kind in NODE_FAULTS:
            _node_fault(rng, series, f)
    observed = [replace(f, onset=_onset(f, series)) for f in faults]
    return Replay(minutes, series, observed, servers)


def _node_series(series: dict[str, list[float | None]], node: str, minutes: int) -> None:
    series[f'up{{job="node",instance="{node}:9100",node="{node}"}}'] = [1.0] * minutes
    series[f'up{{job="gpu-exporter",instance="{node}:9400",node="{node}"}}'] = [1.0] * minutes
    series[f'gpuslice_exporter_source_up{{job="gpu-exporter",instance="{node}:9400",node="{node}"}}'] = [1.0] * minutes
    disk = f'job="node",instance="{node}:9100",node="{node}",mountpoint="/",fstype="ext4"'
    series[f"node_filesystem_size_bytes{{{disk}}}"] = [1e12] * minutes
    series[f"node_filesystem_avail_bytes{{{disk}}}"] = [6e11 - 1e6 * m for m in range(minutes)]


def _sessions(rng: random.Random, minutes: int, node: str, gpu: int, faults: Sequence[Fault]) -> list[bool]:
    """Minutes a server holds a slice of this card: working hours, some days none; faults that need one get one."""
    held = [False] * minutes
    for day in range(math.ceil(minutes / 1440)):
        if (day % 7 >= 5 and rng.random() < 0.7) or rng.random() < 0.15:
            continue
        start, stop = day * 1440 + rng.randrange(8 * 60, 10 * 60), day * 1440 + rng.randrange(16 * 60, 20 * 60)
        for m in range(start, min(stop, minutes)):
            held[m] = True
    for f in faults:
        if f.kind in SESSION_FAULTS and (f.node, f.gpu) == (node, gpu):
            for m in range(max(0, f.start - 30), min(f.end + 30, minutes)):
                held[m] = True
    return held


@dataclass
class Card:
    """One card's minute: what the exporter would read."""

    util: float
    sm: float
    temp: float
    memory: float | None  # its server's processes' GPU memory
    xid: float
    dbe: float
    readable: bool = True  # NVML answers for this card


def _gpu_series(
    rng: random.Random,
    series: dict[str, list[float | None]],
    node: str,
    gpu: int,
    user: str,
    minutes: int,
    faults: Sequence[Fault],
) -> None:
    held = _sessions(rng, minutes, node, gpu, faults)
    mine = [f for f in faults if f.node == node and f.gpu in (gpu, None)]
    names = ("util", "temp", "power", "sm", "fb", "xid", "dbe")
    out: dict[str, list[float | None]] = {name: [0.0] * minutes for name in names}
    allocated: list[float | None] = [None] * minutes
    process: list[float | None] = [None] * minutes
    # The last card of each node sits in a hot spot: at full load it nears its maximum operating temperature.
    ambient = rng.uniform(41, 43) if gpu == GPUS_PER_NODE - 1 else rng.uniform(30, 36)
    context = rng.uniform(0.3, 0.8) * GiB  # cuda-context: outside the framework's cap, in NVML's figure
    fills_slice = rng.random() < 0.3  # assumption: a training job whose caching allocator takes its whole slice
    app_xid = _application_xids(rng, held)
    work = rng.uniform(0.5, 1.0)  # how hard this card's user works it
    last_xid, dbe = 0.0, 0.0
    fill = SLICE_BYTES * rng.uniform(0.9, 1.0)  # the allocator's level, steady through a session
    for m in range(minutes):
        u = min(100.0, max(3.0, 100 * work * load(m) + rng.gauss(0, 8))) if held[m] else 0.0
        if held[m] and (m == 0 or not held[m - 1]):
            fill = SLICE_BYTES * rng.uniform(0.9, 1.0)
        tensors = fill if fills_slice else 6 * GiB + rng.uniform(-0.5, 0.5) * GiB
        if app_xid[m]:
            last_xid = app_xid[m]  # dcgm-fields: the value is the last Xid, until the next one
        card = Card(u, u / 100 * rng.uniform(0.6, 0.9), ambient + 0.4 * u + rng.gauss(0, 1.5),
                    tensors + context if held[m] else None, last_xid, dbe)  # fmt: skip
        for f in mine:
            if f.start <= m < f.end and f.kind not in NODE_FAULTS:
                _apply(f, m - f.start, card, rng)
            elif m == f.end and f.kind in {"xid_storm", "ecc_double_bit", "node_down"}:
                card.xid, card.dbe = 0.0, 0.0  # the card reset (or the node rebooted): DCGM's values start again
        last_xid, dbe = card.xid, card.dbe
        s = card.sm
        power = IDLE_POWER_W + (FULL_POWER_W - IDLE_POWER_W) * (s / 0.9 if s > 0.05 else 0.0)
        values = (card.util, card.temp, power, s, (card.memory or 0.0) / MiB + 500, card.xid, card.dbe)
        for name, value in zip(names, values, strict=True):
            out[name][m] = round(value, 2) if card.readable else None
        allocated[m] = float(SLICE_BYTES) if held[m] else None
        process[m] = float(card.memory) if card.memory is not None and card.readable else None
    scrape = f'job="gpu-exporter",instance="{node}:9400"'
    labels = f'gpu="{gpu}",UUID="GPU-{node[-1]}{gpu}",modelName="NVIDIA {MODEL}",Hostname="{node}",{scrape}'
    dcgm: dict[str, list[float | None]] = {
        "DCGM_FI_DEV_GPU_UTIL": out["util"],
        "DCGM_FI_DEV_GPU_TEMP": out["temp"],
        "DCGM_FI_DEV_POWER_USAGE": out["power"],
        "DCGM_FI_PROF_SM_ACTIVE": out["sm"],
        "DCGM_FI_DEV_FB_USED": out["fb"],
        "DCGM_FI_DEV_XID_ERRORS": out["xid"],
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": out["dbe"],
    }
    for name, column in dcgm.items():
        series[f"{name}{{{labels}}}"] = column
    proc = f'gpu="{gpu}",Hostname="{node}",user="{user}",server="",pid="4242",job="gpu-exporter",instance="{node}:9400"'
    series[f"gpuslice_process_gpu_memory_bytes{{{proc}}}"] = process
    hub = f'node="{node}",gpu="{gpu}",user="{user}",server="",job="jupyterhub",instance="hub:jupyterhub"'
    series[f"gpuslice_gpu_memory_allocated_bytes{{{hub}}}"] = allocated


def _apply(f: Fault, age: int, card: Card, rng: random.Random) -> None:
    """What fault ``f`` does to the card ``age`` minutes after it began."""
    kind, shape = f.kind, f.shape
    if kind == "xid_storm":
        if shape == "fallen_off_bus":
            card.readable = False
        else:
            card.xid = float(CLEANUP_XID) if shape == "hardware_then_cleanup" and age >= 1 else f.param("code")
    elif kind == "ecc_double_bit":
        if age == 0:
            card.xid = 48.0  # xid-catalog: a double-bit error is Xid 48
        if age < f.param("errors"):
            card.dbe += 1
    elif kind == "thermal_runaway":
        if shape == "cooling_failure":
            card.temp = min(f.param("slowdown") + rng.gauss(0, 0.3), card.temp + f.param("rise_per_min") * age)
        else:
            card.temp = max(card.temp, f.param("max_operating") + f.param("over") + rng.gauss(0, 0.3))
    elif kind == "hung_gpu":
        card.util, card.sm = 100.0, f.param("sm_active")
    elif kind == "leaking_notebook":
        grown = (card.memory or 0.0) + f.param("mib_per_min") * MiB * age
        card.memory = min(grown, CARD_BYTES * 0.95)  # the card's own memory ends the leak's growth
    elif kind == "idle_slice_held":
        polled = shape == "polled_idle" and age % int(f.param("poll_every")) == 0
        card.util, card.sm = (float(rng.randint(1, 3)), 0.01) if polled else (0.0, 0.0)


def _node_fault(rng: random.Random, series: dict[str, list[float | None]], f: Fault) -> None:
    """A node or its exporter down: ``up`` 0 and the scrape's series stale, as Prometheus records a failed scrape."""
    exporter = f'instance="{f.node}:9400"'
    node_exporter = f'instance="{f.node}:9100"'
    failing: Callable[[int], bool] = lambda m: True  # noqa: E731
    if f.shape == "flapping":
        ratio = f.param("fail_ratio")
        pattern = [rng.random() < ratio for _ in range(f.end - f.start)]
        pattern = [p and not (i > 0 and pattern[i - 1]) for i, p in enumerate(pattern)]  # never two in a row
        failing = lambda m: pattern[m - f.start]  # noqa: E731
    for sel, values in series.items():
        on_exporter = exporter in sel
        on_node = f.kind == "node_down" and node_exporter in sel
        if not (on_exporter or on_node):
            continue
        for m in range(f.start, f.end):
            if f.shape == "nvml_failing":
                if sel.startswith("gpuslice_exporter_source_up"):
                    values[m] = 0.0
                elif not sel.startswith("up{"):
                    values[m] = None  # the exporter answers without GPU families
            elif failing(m):
                values[m] = 0.0 if sel.startswith("up{") else None


def _application_xids(rng: random.Random, held: Sequence[bool]) -> list[float]:
    """Healthy, not faults: a user's program crashes now and then with an application Xid (device-plugin's list).

    About once in 25 hours of a server running (assumption); 0 where none happened.
    """
    return [float(rng.choice(APPLICATION_XIDS)) if h and rng.random() < 1 / 1500 else 0.0 for h in held]


def _onset(fault: Fault, series: dict[str, list[float | None]]) -> int:
    """The first minute the fault shows in the metrics: what a perfect rule could see.

    For heat and memory: the first sample past what the vendor or the slice allows (the card's
    maximum operating temperature, the slice itself); everything else at once.
    """
    if fault.kind == "thermal_runaway":
        limit = fault.param("max_operating")
        return _first(fault, series, "DCGM_FI_DEV_GPU_TEMP", lambda v: v > limit)
    if fault.kind == "leaking_notebook":
        return _first(fault, series, "gpuslice_process_gpu_memory_bytes", lambda v: v > SLICE_BYTES)
    return fault.start


def _first(fault: Fault, series: dict[str, list[float | None]], metric: str, test: Callable[[float], bool]) -> int:
    key = next(k for k in series if k.startswith(metric + "{") and f'gpu="{fault.gpu}"' in k and f'"{fault.node}"' in k)
    for m in range(fault.start, fault.end):
        v = series[key][m]
        if v is not None and test(v):
            return m
    return fault.start  # never past the line: scored from its start (a miss is a miss)
