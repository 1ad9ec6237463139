"""`python -m autotile` is the `autotile` command."""

import sys

from autotile.cli.main import main

sys.exit(main())
