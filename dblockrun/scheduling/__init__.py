"""When a job is due and what becomes of each slot."""
