"""e2e worker: say READY with this rank's pid, then wait (to be killed with the launcher)."""

from __future__ import annotations

import os
import time

# one write(): the ranks share the launcher's stdout and print() writes the newline separately
os.write(1, f"READY {os.environ['RANK']} {os.getpid()}\n".encode())
time.sleep(120)
