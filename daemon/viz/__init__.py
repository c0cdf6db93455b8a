"""``hilrec view`` and ``hilrec display``: recordings and live telemetry in rerun (rerun-sdk, an
optional extra: ``pip install hilrec[rerun]``)."""
