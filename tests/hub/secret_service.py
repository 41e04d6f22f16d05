"""A stand-in managed service for tests/hub/test_secretenv.py: says what it sees, then waits."""

import json
import os
import time

print(
    json.dumps(
        {
            "token": os.environ.get("JUPYTERHUB_API_TOKEN"),
            "pid": os.getpid(),
        }
    ),
    flush=True,
)
time.sleep(60)
