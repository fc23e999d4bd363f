"""Moving halo rows between workers: process groups, halo plans and views, the cache levels at
run time, the transports of the pipeline modes and the one aggregation they share."""
