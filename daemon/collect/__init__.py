"""``hilrec collect``: a bench session against the daemon, as its client (the top layer).

``cmd_collect`` (the command) starts or attaches to the daemon (``launch``), reads the operator's
keys from the terminal (``keys``), follows the daemon's telemetry (``monitor``), draws the live
panel (``panel``), speaks the prompts (``sounds``) and runs the takes (``session``).
"""
