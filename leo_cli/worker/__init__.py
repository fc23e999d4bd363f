"""One training rank: its entry point and lifecycle, the job assembled from its part, the
training loop, and rank 0's report."""
