"""The hierarchical cache: halo access per part, the hardware profile and its probe, the cost
model, the cache policies and the plan they write (cache-plan.json)."""
