"""dblockrun: a cron replacement for fleets, locked in a shared SQL database."""

__version__ = "0.1.0"
