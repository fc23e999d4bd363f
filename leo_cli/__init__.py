"""LEO: pipelined full-graph GNN training with hierarchical caching."""

__version__ = "0.1.0"
