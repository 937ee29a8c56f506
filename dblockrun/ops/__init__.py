"""Operator commands over the database: status, history, kill, pause, audit."""
