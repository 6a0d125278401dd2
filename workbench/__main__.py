"""``python -m workbench``: the command line (see ``workbench.cli.main``)."""

import sys

from workbench.cli.main import main

sys.exit(main())
