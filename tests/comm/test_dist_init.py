"""How a worker joins its process group: bound to its GPU (NCCL starts eagerly), not on the CPU.

No GPU here: torch.distributed's store and init are replaced by recorders, so what LEO asks of
torch is checked without starting a group.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from leo_cli.comm.dist import DistEnv, init_process_group


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The keyword arguments init_process_group hands to torch (stores are stand-ins)."""
    calls: dict[str, Any] = {}
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setattr(dist, "TCPStore", lambda **kwargs: object())
    monkeypatch.setattr(dist, "PrefixStore", lambda prefix, store: (prefix, store))

    def fake_init(backend: str, **kwargs: Any) -> None:
        calls.update(kwargs, backend=backend)

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    return calls


ENV = DistEnv(rank=1, world_size=2, local_rank=1, restart=3)


def test_a_cuda_worker_binds_its_group_to_its_device(recorded: dict[str, Any]) -> None:
    init_process_group(ENV, "cpu:gloo,cuda:nccl", 30.0, torch.device("cuda", 1))
    assert recorded["device_id"] == torch.device("cuda", 1)
    assert recorded["backend"] == "cpu:gloo,cuda:nccl" and recorded["rank"] == 1
    assert recorded["store"][0] == "leo/attempt3"


@pytest.mark.parametrize("device", [torch.device("cpu"), None])
def test_a_cpu_worker_passes_no_device(recorded: dict[str, Any], device: Any) -> None:
    init_process_group(ENV, "gloo", 30.0, device)
    assert recorded["device_id"] is None
