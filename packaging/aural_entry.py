"""The bundle's `aural` executable: the same entry point as the console script of the wheel."""

import sys

from aural.engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
