"""The rank harness: what every rank process does around its work, training and probe ranks
alike: dying with its launcher, CPU pinning, a heartbeat, a user error as one sentence in an
error file, and leaving without interpreter teardown."""
