"""The GAT CUDA kernels' per-thread bodies, run on the CPU by cuda/tests/gat_emulation.cu
against a float64 reference of the formulas (no GPU needed, only nvcc)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_kernel_compile import CUDA_DIR, nvcc_or_skip

from leo_cli.kernel_tools.check import TORCH_NVCC_FLAGS

pytestmark = pytest.mark.integration  # an nvcc build, then the emulation it builds


def test_gat_kernel_bodies_match_the_reference(tmp_path: Path) -> None:
    nvcc = nvcc_or_skip()
    exe = tmp_path / "gat_emulate"
    source = CUDA_DIR / "tests" / "gat_emulation.cu"
    cmd = [str(nvcc), "-std=c++17", "-O1", *TORCH_NVCC_FLAGS, "-I", str(CUDA_DIR / "include")]
    subprocess.run([*cmd, str(source), "-o", str(exe)], check=True, capture_output=True, text=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "9 cases, 0 failed" in result.stdout
