"""`python -m autotile` is the `autotile` command."""

import sys

from .cli import main

sys.exit(main())
