"""The cyclic garbage collector's policy in a `streaming-server` process.

With CPython's default thresholds a full collection walks every live object every ~700 x 10 x 10
allocations; in a server holding a restart's worth of pending messages that is a pause of tens of ms in
the middle of a redelivery pass. So once its modules are loaded the process collects, freezes what
exists (code, classes) out of every later scan and raises the thresholds; after recovery it freezes the
recovered state as well. That one collection comes before recovery on purpose: with 100,000 pending
messages recovered it would take twice as long (~25 ms more on the critical path of a restart). Raising
the thresholds from the process's first line instead would save the ~20 ms of young collections while
the modules load, at ~1 MB more resident memory for good (the garbage they leave is collected later,
in a heap that has grown meanwhile), so it is not done. Cycles are still collected.

The entry point calls these; `serve` never does, so a program that runs servers inside it (a test run)
keeps its own policy.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 50, 100)


def settle() -> None:
    """Once what lives for the whole run is built: collect, freeze it out of later scans, and use the
    server's thresholds from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def recovered() -> None:
    """After recovery, before serving: the recovered state joins what is frozen (without a collection,
    which would walk it: recovery leaves next to no cyclic garbage)."""
    gc.freeze()
