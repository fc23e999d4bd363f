"""Graphs: datasets, partitioners, each worker's layout (inner, halo, boundary rows) and the
on-disk partition format."""
