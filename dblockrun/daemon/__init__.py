"""The daemon: its main loop, its attempts and the threads beside it."""
