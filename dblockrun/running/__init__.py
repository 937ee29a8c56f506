"""One run: its lifecycle, its command through the spawn service, its lease."""
