"""Command-line entry points (`quartet ...`); each subcommand lives in its own module.

Importing this package sets `GOMP_SPINCOUNT=10000` unless the environment sets it, before any subcommand
imports torch. An idle OpenMP thread of libgomp (torch's OpenMP on Linux) spins 300,000 times before it
sleeps, holding a core that another process on the machine needs. With 10,000 spins a training step alone
is ~3% slower, and two runs sharing two cores went from 4.1x to 2.7x slower each
(`benchmarks/oversubscription.py`; `docs/throughput.md`). A local Ray started by the run passes it on to its
host processes; `OMP_WAIT_POLICY=PASSIVE` suits a machine that is always shared.
"""

import os as _os

_os.environ.setdefault("GOMP_SPINCOUNT", "10000")
