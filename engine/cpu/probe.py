"""The CPU probe's child process: `python -m aural.engine.cpu.probe VARIANT [--skip BUFT ...]`.

Loads ggml's CPU variant VARIANT ("" for a build with the CPU linked in) with every extra buffer type
allowed, and runs each weight type's matrix product in each buffer type (native/cpu-probe.h). Before each
case it prints `start BUFT TYPE`; at the end `results JSON`. A kernel that faults kills this process, and
the parent (aural.engine.cpu) reads from the last `start` line where it struck. Buffer types named by
--skip are not run. AURAL_CPU_PROBE_FAULT=BUFT (or VARIANT/BUFT) makes the child die of SIGILL where
BUFT's first case starts, as AMX did on issue #16's VM: the tests' way to reach the fault path on any CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def run(variant: str, skip: list[str]) -> int:
    from aural import _native

    _native.configure_cpu(variant=variant, excluded_bufts=[], reason="the CPU probe")

    def on_start(buft: str, wtype: str) -> bool:
        if buft in skip:
            return False
        print(f"start {buft} {wtype}", flush=True)
        if os.environ.get("AURAL_CPU_PROBE_FAULT") in (buft, f"{variant}/{buft}"):
            signal.signal(signal.SIGILL, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGILL)
        return True

    results = _native.probe_cpu(on_start)
    print("results " + json.dumps(results), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aural-cpu-probe")
    parser.add_argument("variant")
    parser.add_argument("--skip", action="append", default=[])
    args = parser.parse_args(argv)
    return run(args.variant, args.skip)


if __name__ == "__main__":
    sys.exit(main())
