"""``python -m headwater.dashboards``: write (or ``--check``) the dashboard JSON."""

from __future__ import annotations

import sys

from headwater.dashboards import main

sys.exit(main())
