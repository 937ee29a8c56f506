"""Notifications (apprise) and heartbeat pings."""
