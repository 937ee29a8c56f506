"""SQL text shared by the SQLAlchemy store and the lean ``exec`` path (no imports)."""

SCHEMA_VERSION = 3  # 2: items (fan-out jobs); 3: names compared byte for byte (MySQL)

#: The database clock in epoch seconds, read per statement.
NOW = {
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    # NOW(6) is the statement's start; the session runs in UTC (see engine_options).
    "mysql": "CAST(UNIX_TIMESTAMP(NOW(6)) AS DOUBLE)",
    # 'now' is stable within one statement.
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
