"""``python -m processor.cli``: the ``processor`` command."""

import sys

from processor.cli.main import main

sys.exit(main())
