"""Run-safety helpers every layer may use: safe file writes and interruption handling."""
