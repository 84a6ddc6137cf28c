"""`python -m aural.app [--replay FILE] [--start] [FILES...]`."""

import sys

from .main import main

sys.exit(main())
