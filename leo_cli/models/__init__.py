"""The GNN layers (GCN, GraphSAGE, GIN, GAT) on a worker's local graph, and dropout whose masks
do not depend on the worker count."""
