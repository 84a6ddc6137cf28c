"""The bundle's `aural` executable: the same entry point as the console script of the wheel."""

import sys

from aural.engine.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--cpu-probe"]:  # aural.engine.cpu runs its probe child as `aural --cpu-probe VARIANT`
        from aural.engine.cpu import probe

        sys.exit(probe.main(sys.argv[2:]))
    if sys.argv[1:2] == ["--device-process"]:  # aural.engine.isolation's child: `aural --device-process FD FD FD`
        from aural.engine.isolation import child

        sys.exit(child.main(sys.argv[2:]))
    sys.exit(main())
