"""The hierarchical cache: hardware probe and profile (more to come: access profiling, cost
model, cache policies, plan I/O)."""
