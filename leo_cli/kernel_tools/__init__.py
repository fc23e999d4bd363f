"""Tooling around the kernels, apart from the runtime ops in leo_cli/kernels: `leo compile`
(build, and the nvcc compile check), the CPU and GPU kernel benchmarks and their synthetic
graphs. Tools import the runtime; the runtime never imports them."""
