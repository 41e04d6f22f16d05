"""Time Ctrl-C on `gpuslice up` with a class (issue 19): prints seconds from SIGINT to exit.

Usage (heavy: starts the platform): .venv/bin/python scripts/ctrl_c_timing.py FOLDER [group|leader|ignored]
group: SIGINT to the process group, as a terminal sends; leader: to `gpuslice up` only;
ignored: as group, with the platform started with SIGINT ignored (`gpuslice up &` from a script).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.e2e.platform import GPUSLICE, Platform

root = Path(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "group"  # group | leader | ignored (SIGINT ignored as by `cmd &`)
p = Platform(root, {"groups": {"ml101": {"members": ["alice", "bob"], "max_slice": "4GiB", "budget": "8GiB"}}})
with p.log.open("ab") as log:
    proc = subprocess.Popen(
        [GPUSLICE, "up", "--config", str(p.config)],
        stdout=log,
        stderr=log,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if mode == "ignored" else None,
    )
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        if requests.get(f"{p.url}/hub/health", timeout=2).status_code == 200:
            break
    except requests.RequestException:
        pass
    time.sleep(0.3)
time.sleep(8)  # the services (portal gate, Streamlit, culler) up
t0 = time.monotonic()
if mode == "leader":
    os.kill(proc.pid, signal.SIGINT)
else:
    os.killpg(proc.pid, signal.SIGINT)
proc.wait(timeout=120)
print(f"{mode}: Ctrl-C to exit: {time.monotonic() - t0:.1f} s")
WORDS = ("Cleaning", "Stopping", "Interrupt", "Terminat", "Killing", "never died", "exited", "Shutting")
for line in p.log.read_text().splitlines():
    if any(word in line for word in WORDS):
        print(line[:200])
