"""`leo bench`: LEO's modes and PyG's peers interleaved over rounds, their statistics and the
report (table, CSV, JSON, plots)."""
