"""The cache plan: read side (the plan file, `load_plan`, `pipeline.mode=auto`, in-place reach,
config checks) and the making side (halo access, cost model, policies, part weights)."""
