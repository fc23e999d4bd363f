"""Config schema, YAML loading, `--set` overrides and dumping."""

from leo_cli.config.load import dump_config, load_config, write_resolved
from leo_cli.config.schema import LeoConfig

__all__ = ["LeoConfig", "dump_config", "load_config", "write_resolved"]
