"""Training: the parent side of `leo train` (partitions, plan, elastic launch) and the rank side
(assemble a job, train, write the run files)."""
