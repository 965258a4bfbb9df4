"""e2e worker: say READY with this rank's pid, then wait (to be killed with the launcher)."""

from __future__ import annotations

import os
import time

print("READY", os.environ["RANK"], os.getpid(), flush=True)
time.sleep(120)
