"""User-facing errors: one clear sentence each, rendered by the CLI without a traceback."""


class LeoError(Exception):
    """Base class of every error caused by user input (config, data, files on disk)."""


class ConfigError(LeoError):
    """The config file, a `--set` override or a flag is missing, unparsable or invalid."""


class DataError(LeoError):
    """A dataset cannot be found or read."""


class PartitionError(LeoError):
    """Partitions on disk are missing, corrupt or do not match the config."""


class TrainError(LeoError):
    """Training stopped because of a condition the user must act on."""


class KernelError(LeoError):
    """Kernels cannot be built, loaded or given the arrays they need (CSR, extension, nvcc)."""


class CacheError(LeoError):
    """A hardware profile or cache plan is missing, unreadable or does not fit the run."""


def tensorboard_missing() -> str:
    """The sentence for `run.tensorboard=true` without the tensorboard package (said by the
    launcher before anything starts, and by rank 0 under a plain torchrun)."""
    return (
        "run.tensorboard=true needs the tensorboard package: pip install tensorboard, or set "
        "run.tensorboard=false."
    )
