"""``python -m headwater.telemetry``: the reduction benchmark."""

from headwater.telemetry.bench import main

raise SystemExit(main())
