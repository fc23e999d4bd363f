"""Fails to import, as DGL 2.1's graphbolt does without torchdata."""

raise ModuleNotFoundError("No module named 'torchdata'")
