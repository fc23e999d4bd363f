"""The parent process of a run: partitions, hardware profile and cache plan before launch,
torch's elastic launch of the workers, their allocator and the heartbeat watch."""
