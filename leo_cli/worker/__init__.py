"""One training rank: its entry point, the `Trainer` (the job assembled from its part in the
order set-up happens, the epoch loop), the step, and rank 0's report."""
