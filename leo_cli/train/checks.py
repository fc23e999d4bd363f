"""Config checks that every start of training runs: in the launcher (`leo train`) and in each
worker, since plain `torchrun -m leo_cli.train.worker` starts workers without the launcher.

Settings whose feature does not exist yet are refused with one sentence naming the key,
rather than validated and then ignored, or failing deep inside a worker.
"""

from __future__ import annotations

from pydantic import BaseModel

from leo_cli.config import LeoConfig
from leo_cli.errors import ConfigError

IMPLEMENTED_MODES = ("blocking",)
IMPLEMENTED_CACHE_POLICIES = ("none",)
# Settings that validate but that no code reads yet (a key, or a whole section), and why.
_NO_CACHE = "no cache level holds rows before the cache policies land"
NOT_READ = {
    "cache.replica_budget_mb": _NO_CACHE,
    "cache.halo_budget_mb": _NO_CACHE,
    "bench": "`leo bench` does not exist, so no command reads bench.*",
}


def check_config(cfg: LeoConfig) -> None:
    """Refuse settings that training cannot honour yet."""
    if cfg.cache.policy not in IMPLEMENTED_CACHE_POLICIES:
        raise ConfigError(
            f"cache.policy={cfg.cache.policy!r} is not implemented yet; use cache.policy=none "
            "(every halo row is exchanged in bulk each layer)."
        )
    if cfg.pipeline.mode not in IMPLEMENTED_MODES:
        raise ConfigError(
            f"pipeline.mode={cfg.pipeline.mode!r} is not implemented yet; use "
            f"pipeline.mode=blocking (available: {', '.join(IMPLEMENTED_MODES)})."
        )
    for section_name in ("cache", "bench"):
        section: BaseModel = getattr(cfg, section_name)
        default = type(section)()
        for name in type(section).model_fields:
            key, value = f"{section_name}.{name}", getattr(section, name)
            why = NOT_READ.get(key) or NOT_READ.get(section_name)
            if why and value != getattr(default, name):
                raise ConfigError(
                    f"{key}={value!r} is not implemented yet ({why}); leave it at its "
                    f"default {getattr(default, name)!r}."
                )
