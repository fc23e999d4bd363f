"""Config schema, YAML loading, `--set` overrides and dumping."""

from leo_cli.config.load import config_fingerprint, dump_config, load_config, write_resolved
from leo_cli.config.schema import LeoConfig

__all__ = ["LeoConfig", "config_fingerprint", "dump_config", "load_config", "write_resolved"]
