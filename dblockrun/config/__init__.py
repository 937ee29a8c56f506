"""The jobs file: YAML to frozen jobs, durations, secrets, crontab import."""
