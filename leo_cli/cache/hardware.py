"""The hardware profile: what the probe of `leo profile-cache` measured, its JSON file, and the
rate lookups the cost model prices pipeline stages with.

One file (`<run_dir>/hardware.json`, or any file passed with `--hardware`) holds compute rates
per row width (SpMM forward and backward, GEMM, dropout masks, row gather, row scatter-add),
measured while every worker computed at once (the contention training sees), and the links
between workers: the process group (gloo `isend`/`irecv`) and a /dev/shm segment, each fitted
as `seconds = latency + bytes / bandwidth`, per pair of workers and with every pair at once.

Between measured widths a rate is interpolated log-log (a power law between neighbours).
Below the narrowest width the narrowest rate holds (a row never costs less than its
overhead); above the widest, per-row and per-edge rates fall as 1 / width (the throughput in
elements per second stays the widest one's). GEMM FLOP/s is looked up at the geometric mean
of the input and output widths and held constant outside the measured range.

Units: seconds (s), bytes (B); rates are per second. A width is a row's element count.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import os
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from leo_cli.errors import CacheError

FORMAT_VERSION = 1
HARDWARE_FILE = "hardware.json"
Link = Literal["gloo", "shm"]

Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Width = Annotated[int, Field(ge=1)]

_REDO = "delete it and run `leo profile-cache` to probe again, or pass a valid file with --hardware"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ProbeSizes(_Record):
    """How much work each measurement of the probe does (recorded in the profile)."""

    widths: tuple[Width, ...] = (8, 16, 32, 64, 128, 256)
    """Row widths (elements) at which every compute rate is measured, increasing."""
    spmm_elements: int = Field(1 << 23, ge=1)
    """Edges x width of one SpMM call (each width gets its own random CSR of this size)."""
    avg_degree: int = Field(16, ge=1)
    """Edges per row of the probe's CSRs; they have twice as many columns as rows."""
    dense_elements: int = Field(1 << 20, ge=1)
    """Rows x width of one GEMM, mask, gather or scatter-add call."""
    repeats: int = Field(5, ge=1)
    """Timed calls per measurement after one warm-up; the median is kept."""
    small_message_bytes: int = Field(256, ge=4)
    """Message size (B) of the latency point of each link fit."""
    large_message_bytes: int = Field(4 << 20, ge=8)
    """Message size (B) of the bandwidth point of each link fit (4 MiB: a pipeline chunk)."""
    small_iters: int = Field(50, ge=1)
    """Small transfers timed one at a time per link fit (median kept, after one warm-up)."""
    large_iters: int = Field(8, ge=1)
    """Large transfers timed one at a time per link fit (median kept, after one warm-up)."""

    @model_validator(mode="after")
    def _check(self) -> ProbeSizes:
        if not increasing(self.widths):
            raise ValueError("widths must be a non-empty increasing list")
        if self.large_message_bytes <= self.small_message_bytes:
            raise ValueError("large_message_bytes must exceed small_message_bytes")
        return self


class ComputeRates(_Record):
    """Kernel throughput of one worker while all workers compute at once (median over ranks)."""

    widths: list[Width]
    """Row widths (elements per row) at which each rate below was measured, increasing."""
    spmm_edges_per_s: list[Rate]
    """Forward aggregation `A @ X` (`kernels.spmm`): edges per second, one per width."""
    spmm_t_edges_per_s: list[Rate]
    """Backward aggregation `A^T @ G` (the SpMM's autograd backward): edges per second."""
    gemm_flop_per_s: list[Rate]
    """Dense update `F.linear` with in = out = width: FLOP (2 x rows x in x out) per second."""
    mask_rows_per_s: list[Rate]
    """Counter-based dropout, mask generation and apply: rows per second."""
    gather_rows_per_s: list[Rate]
    """Row gather `x[idx]` (`kernels.gather_rows`, packs send buffers): rows per second."""
    scatter_add_rows_per_s: list[Rate]
    """Row scatter-add `out.index_add_(0, idx, src)` (unpacks gradients): rows per second."""

    @model_validator(mode="after")
    def _check(self) -> ComputeRates:
        if not increasing(self.widths):
            raise ValueError("widths must be a non-empty increasing list")
        for name in type(self).model_fields:
            if len(getattr(self, name)) != len(self.widths):
                raise ValueError(f"{name} must hold one rate per width ({len(self.widths)})")
        return self


class LinkFit(_Record):
    """`seconds = latency_s + bytes / bandwidth_bytes_per_s` for one message to one peer."""

    bandwidth_bytes_per_s: Rate
    """Bytes per second in one direction while the other direction is busy too."""
    latency_s: Seconds
    """Seconds a message costs besides its bytes."""


class PairFit(LinkFit):
    """The fit of one pair of workers, measured while the other workers waited."""

    ranks: tuple[int, int]
    """The two global ranks, lower first."""


class LinkProfile(_Record):
    """One transport between workers: both directions of a pair move at once, as in training."""

    concurrent: LinkFit
    """Every worker exchanging with every other at once (a layer's halo exchange): per peer."""
    pairs: list[PairFit]
    """One pair at a time, for every pair of workers."""


class Links(_Record):
    """The transports between workers; null when the probe ran a single worker."""

    gloo: LinkProfile | None
    """The process group (gloo `isend`/`irecv`, the pipeline's transport)."""
    shm: LinkProfile | None
    """A /dev/shm segment: write rows, barrier, a peer reads them (null across hosts). Its
    latency is the barrier's time, its bandwidth that of the copies in and out."""
    barrier_s: Seconds | None
    """Seconds of one `dist.barrier()` of all workers."""


class HardwareProfile(_Record):
    """Everything the probe measured on one machine with one worker count."""

    format_version: int
    """Version of this file's layout (FORMAT_VERSION)."""
    created_utc: str
    """When the probe ran (ISO 8601, UTC)."""
    hostname: str
    """Host of rank 0."""
    device: str
    """Where the compute rates were measured (`cpu`)."""
    torch_version: str
    """torch.__version__ of the workers."""
    kernels_backend: str
    """`kernels.backend_name()`: `reference` or `cuda`."""
    dtype: str
    """Element type of every measured row (`float32`); bytes per element follow from it."""
    world_size: int = Field(ge=1)
    """Workers that ran the probe at once (`partition.num_parts`)."""
    threads_per_worker: int = Field(ge=1)
    """Intra-op threads of each worker (`torch.get_num_threads()`, from OMP_NUM_THREADS)."""
    quick: bool
    """Measured with the quick (test) sizes: rates are rough."""
    probe_s: Seconds
    """Wall seconds rank 0 spent measuring (process start-up excluded)."""
    sizes: ProbeSizes
    """The work each measurement did."""
    compute: ComputeRates
    """Kernel rates per width."""
    links: Links
    """Link fits between workers."""

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        gloo, world = self.links.gloo, self.world_size
        if (gloo is None) != (world == 1) or (self.links.barrier_s is None) != (world == 1):
            raise ValueError("links.gloo and links.barrier_s are measured iff world_size > 1")
        for link in (gloo, self.links.shm):
            if link is not None and len(link.pairs) != world * (world - 1) // 2:
                raise ValueError(f"a link needs one pair fit per pair of the {world} workers")
        return self

    # -- compute ------------------------------------------------------------------------------

    def spmm_seconds(self, num_edges: int, width: int, backward: bool = False) -> float:
        """Seconds of one SpMM over `num_edges` edges at `width` (backward: `A^T @ G`)."""
        c = self.compute
        rates = c.spmm_t_edges_per_s if backward else c.spmm_edges_per_s
        return num_edges / per_row_rate(c.widths, rates, width)

    def gemm_seconds(self, rows: int, in_width: int, out_width: int) -> float:
        """Seconds of `F.linear` on (rows x in_width) with an (out_width x in_width) weight.

        A layer's backward costs two more of these: (rows x out) @ (out x in) and the weight
        gradient (in x rows) @ (rows x out), the same FLOP count.
        """
        flop = 2.0 * rows * in_width * out_width
        if flop == 0:
            return 0.0
        c = self.compute
        return flop / interpolate(c.widths, c.gemm_flop_per_s, math.sqrt(in_width * out_width))

    def mask_seconds(self, rows: int, width: int) -> float:
        """Seconds of counter-based dropout (mask + apply) on (rows x width)."""
        return rows / per_row_rate(self.compute.widths, self.compute.mask_rows_per_s, width)

    def gather_seconds(self, rows: int, width: int) -> float:
        """Seconds to gather `rows` rows of `width` into a contiguous buffer (pack)."""
        return rows / per_row_rate(self.compute.widths, self.compute.gather_rows_per_s, width)

    def scatter_add_seconds(self, rows: int, width: int) -> float:
        """Seconds to add `rows` received rows of `width` into their places (unpack)."""
        rates = self.compute.scatter_add_rows_per_s
        return rows / per_row_rate(self.compute.widths, rates, width)

    # -- links --------------------------------------------------------------------------------

    def transfer_seconds(
        self,
        num_bytes: float,
        num_messages: int,
        link: Link = "gloo",
        *,
        concurrent: bool = True,
        pair: tuple[int, int] | None = None,
    ) -> float:
        """Seconds to move `num_bytes` to one peer in `num_messages` messages over `link`.

        Args:
            num_bytes: bytes sent to that peer (its replies flow at the same time).
            num_messages: messages they travel in (each pays the latency once).
            link: `gloo` (the process group) or `shm` (a shared segment + barrier).
            concurrent: every worker exchanges with every peer at once (a layer's exchange);
                False: this pair alone.
            pair: the two ranks, for their own isolated fit (implies concurrent=False).
        """
        fit = self.link_fit(link, concurrent=concurrent, pair=pair)
        return num_bytes / fit.bandwidth_bytes_per_s + num_messages * fit.latency_s

    def link_fit(
        self, link: Link, *, concurrent: bool = True, pair: tuple[int, int] | None = None
    ) -> LinkFit:
        """The fit for `link`: all pairs at once, one given pair, or the median pair."""
        profile = self.links.gloo if link == "gloo" else self.links.shm
        if profile is None:
            why = "one worker" if self.world_size == 1 else "workers on several hosts"
            raise CacheError(
                f"The hardware profile has no {link} link measurement (probed with {why}); "
                "probe again with every worker on one host and partition.num_parts >= 2."
            )
        if pair is not None:
            wanted = (min(pair), max(pair))
            for fit in profile.pairs:
                if fit.ranks == wanted:
                    return fit
            raise CacheError(
                f"The hardware profile has no pair {wanted} (probed with {self.world_size} "
                "workers); probe again with the worker count you train with."
            )
        if concurrent:
            return profile.concurrent
        return LinkFit(
            bandwidth_bytes_per_s=statistics.median(p.bandwidth_bytes_per_s for p in profile.pairs),
            latency_s=statistics.median(p.latency_s for p in profile.pairs),
        )

    def barrier_seconds(self) -> float:
        """Seconds of one barrier of all workers (0 for a single worker)."""
        return self.links.barrier_s or 0.0

    # -- file ---------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON content; a plan made from another profile is stale."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def write(self, path: Path) -> None:
        """Write the profile atomically (temporary file in the same folder, then rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # left only when the rename failed

    @classmethod
    def read(cls, path: Path) -> HardwareProfile:
        """Read and validate a profile.

        Raises:
            CacheError: the file is missing, unreadable, not JSON, of another format version,
                or incomplete; the message names the file and what to do.
        """
        data = _read_json(path)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise CacheError(
                f"Hardware profile {path} has format_version {version!r} but this leo reads "
                f"version {FORMAT_VERSION}; {_REDO}."
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "top level"
            raise CacheError(
                f"Hardware profile {path} is incomplete or invalid ({where}: {first['msg']}); "
                f"{_REDO}."
            ) from None


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or a CacheError naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CacheError(
            f"Hardware profile {path} does not exist; run `leo profile-cache` to probe this "
            "machine, or pass an existing file with --hardware."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CacheError(f"Cannot read hardware profile {path} ({reason}); {_REDO}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CacheError(
            f"Hardware profile {path} is not valid JSON ({exc.msg} at line {exc.lineno}); {_REDO}."
        ) from None
    if not isinstance(data, dict):
        raise CacheError(f"Hardware profile {path} does not hold a JSON object; {_REDO}.")
    return data


def increasing(widths: tuple[int, ...] | list[int]) -> bool:
    """Non-empty and strictly increasing."""
    return bool(widths) and all(a < b for a, b in itertools.pairwise(widths))


def interpolate(widths: list[int], rates: list[float], width: float) -> float:
    """The rate at `width`, log-log between the measured neighbours, clamped at both ends."""
    assert width > 0, f"width must be positive, got {width}"
    if width <= widths[0]:
        return rates[0]
    if width >= widths[-1]:
        return rates[-1]
    i = bisect.bisect_right(widths, width) - 1
    t = math.log(width / widths[i]) / math.log(widths[i + 1] / widths[i])
    return math.exp((1 - t) * math.log(rates[i]) + t * math.log(rates[i + 1]))


def per_row_rate(widths: list[int], rates: list[float], width: float) -> float:
    """A rows/s or edges/s rate at `width`: interpolated, and above the widest measured width
    scaled by widest / width (elements per second stay the widest one's)."""
    rate = interpolate(widths, rates, width)
    return rate * widths[-1] / width if width > widths[-1] else rate
