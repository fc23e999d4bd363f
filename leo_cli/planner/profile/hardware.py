"""The hardware profile: what the probe of `leo profile-cache` measured, and its JSON file.

One file (`<run_dir>/hardware.json`, or any file passed with `--hardware`) holds compute rates,
measured with all workers running each kernel at once and kept per rank, and the links between
workers (process group, /dev/shm segment, barrier, overlap, rows read in place). The cost model
looks its rates up through planner/profile/rates.py.

Specification: docs/design/cost-model.md.
Units: seconds (s), bytes (B); rates are per second. A width is a row's element count.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from leo_cli.errors import CacheError
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.strict import Finite, Whole

# 3: rates per rank and the placement they were measured under; 4: per-rank compute rates timed
# over 30 ms windows of calls (3 timed one call per sample: workers sharing a core looked as fast
# as one alone on its core); 5: `links.in_place`, the SpMM over rows a peer has just published;
# 6: launched with the defaults' memory settings (freed memory handed back, huge pages)
FORMAT_VERSION = 6
HARDWARE_FILE = RunDir.HARDWARE
Link = Literal["gloo", "shm"]
MiB = 1 << 20

# Physical bounds of what a probe can measure (a file outside them was not measured: it was
# edited, or the probe broke). Per second, at most: 1e16 FLOP (an H200 does about 1e15 dense
# fp16 FLOP/s), 1e14 bytes (20x an H200's 4.8 TB/s of HBM), 1e13 rows or edges (each moves 4
# bytes or more). At least 1 of anything per second: no machine that runs the probe is slower,
# and the bound keeps every predicted time finite (rates of 1e-300 made them NaN). A message
# costs at most 60 s beside its bytes (a link slower than that is down); the probe takes at
# most a day.
FlopRate = Annotated[Finite, Field(ge=1.0, le=1e16)]
ByteRate = Annotated[Finite, Field(ge=1.0, le=1e14)]
Rate = Annotated[Finite, Field(ge=1.0, le=1e13)]
Seconds = Annotated[Finite, Field(ge=0, le=60.0)]
Width = Annotated[Whole, Field(ge=1, le=1 << 20)]
Bytes = Annotated[Whole, Field(ge=1, le=1 << 40)]
Share = Annotated[Finite, Field(ge=0, le=1)]
Count = Annotated[Whole, Field(ge=1, le=1 << 30)]
Load = Annotated[Finite, Field(ge=0, le=1e6)]
# Other load above this share of the cores (mean over the probe) makes its rates this
# machine's under load, not its own: not saved machine-wide. LEO_PROBE_LOAD_LIMIT overrides.
HIGH_LOAD_SHARE = 0.25

_REDO = "delete it and run `leo profile-cache` to probe again, or pass a valid file with --hardware"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ProbeSizes(_Record):
    """How much work each measurement of the probe does (recorded in the profile)."""

    widths: tuple[Width, ...] = (8, 16, 32, 64, 128, 256)
    """Row widths (elements) at which every compute rate is measured, increasing."""
    spmm_bytes: tuple[Bytes, ...] = (1 * MiB, 8 * MiB, 32 * MiB)
    """Working-set sizes (B) of the SpMM measurements, increasing: the matrix the edges read."""
    avg_degree: Count = 16
    """Edges summed into each written row of the probe's SpMMs (see `probe.gather_shape`)."""
    spmm_min_edges: Count = 1 << 16
    """Fewest edges of one SpMM call (small working sets would time call overheads)."""
    dense_elements: Count = 1 << 21
    """Rows x width of one GEMM, gather or scatter-add call."""
    mask_elements: Count = 1 << 20
    """Rows x width of one dropout call (forward, then backward)."""
    pass_bytes: tuple[Bytes, ...] = tuple(MiB << k for k in range(7))
    """Output sizes (B) of the elementwise pass measurements, increasing (1 to 64 MiB)."""
    repeats: Count = 3
    """Timed calls per measurement after one warm-up; the median is kept."""
    small_message_bytes: Annotated[Bytes, Field(ge=4)] = 256
    """Message size (B) of the latency point of each link fit."""
    large_message_bytes: Annotated[Bytes, Field(ge=8)] = 4 << 20
    """Message size (B) of the bandwidth point of each link fit (4 MiB: a pipeline chunk)."""
    small_iters: Count = 20
    """Small transfers timed one at a time per link fit (median kept, after one warm-up)."""
    large_iters: Count = 5
    """Large transfers timed one at a time per link fit (median kept, after one warm-up)."""

    @model_validator(mode="after")
    def _check(self) -> ProbeSizes:
        for name in ("widths", "spmm_bytes", "pass_bytes"):
            if not increasing(getattr(self, name)):
                raise ValueError(f"{name} must be a non-empty increasing list")
        if self.large_message_bytes <= self.small_message_bytes:
            raise ValueError("large_message_bytes must exceed small_message_bytes")
        return self


class ComputeRates(_Record):
    """Kernel throughput of one worker (or the slowest) while all workers run the kernel at
    once."""

    widths: list[Width]
    """Row widths (elements per row) at which each per-width rate below was measured."""
    spmm_bytes: list[Bytes]
    """Working-set sizes (B) of the SpMM rates, increasing."""
    spmm_edges_per_s: list[list[Rate]]
    """Forward aggregation `A @ X` (`kernels.spmm`), X of `spmm_bytes[i]` bytes, uniformly
    random columns: edges per second, [size][width]."""
    spmm_t_edges_per_s: list[list[Rate]]
    """Backward aggregation `A^T @ G` (the SpMM's autograd backward), G of `spmm_bytes[i]`
    bytes: edges per second, [size][width]."""
    gemm_flop_per_s: list[FlopRate]
    """Dense update `F.linear` with in = out = width: FLOP (2 x rows x in x out) per second."""
    gemm_narrow_bytes_per_s: list[ByteRate]
    """`F.linear` from width to 8 columns (memory bound): bytes in + out per second."""
    mask_rows_per_s: list[Rate]
    """Counter-based dropout forward (mask generation and apply): rows per second."""
    mask_backward_rows_per_s: list[Rate]
    """Its autograd backward (the mask applied to the gradient): rows per second."""
    gather_rows_per_s: list[Rate]
    """Row gather `x[idx]` (`kernels.gather_rows`, packs send buffers): rows per second."""
    scatter_add_rows_per_s: list[Rate]
    """Row scatter-add `out.index_add_(0, idx, src)` (unpacks gradients): rows per second."""
    pass_bytes: list[Bytes]
    """Output sizes (B) of the elementwise pass rates, increasing."""
    pass_bytes_per_s: list[ByteRate]
    """Elementwise `a + b` into a fresh tensor: output bytes per second, one per size."""

    @model_validator(mode="after")
    def _check(self) -> ComputeRates:
        for name in ("widths", "spmm_bytes", "pass_bytes"):
            if not increasing(getattr(self, name)):
                raise ValueError(f"{name} must be a non-empty increasing list")
        for name in ("spmm_edges_per_s", "spmm_t_edges_per_s"):
            table = getattr(self, name)
            if len(table) != len(self.spmm_bytes) or any(
                len(row) != len(self.widths) for row in table
            ):
                raise ValueError(f"{name} must hold one rate per size and width")
        for name in type(self).model_fields:
            values = getattr(self, name)
            if name.startswith(("spmm", "pass", "widths")) or len(values) == len(self.widths):
                continue
            raise ValueError(f"{name} must hold one rate per width ({len(self.widths)})")
        if len(self.pass_bytes_per_s) != len(self.pass_bytes):
            raise ValueError("pass_bytes_per_s must hold one rate per size")
        return self


class LinkFit(_Record):
    """`seconds = latency_s + bytes / bandwidth_bytes_per_s` for one message to one peer."""

    bandwidth_bytes_per_s: ByteRate
    """Bytes per second in one direction while the other direction is busy too."""
    latency_s: Seconds
    """Seconds a message costs besides its bytes."""


class PairFit(LinkFit):
    """The fit of one pair of workers, measured while the other workers waited."""

    ranks: tuple[Annotated[Whole, Field(ge=0)], Annotated[Whole, Field(ge=0)]]
    """The two global ranks, lower first."""


class LinkProfile(_Record):
    """One transport between workers: both directions of a pair move at once, as in training."""

    concurrent: LinkFit
    """Every worker exchanging with every other at once (a layer's halo exchange): per peer,
    the mean over ranks."""
    pairs: list[PairFit]
    """One pair at a time, for every pair of workers."""
    ranks: list[LinkFit] | None = None
    """Each rank's own fit of the exchange with every peer at once (rank order; a worker on
    a busier core packs and unpacks its messages more slowly)."""


class InPlaceRead(_Record):
    """Reading a peer's published rows in place (comm/published.py), against local rows.

    Every rank times the same SpMM twice, both over rows written just before it: rows of
    its own memory that it wrote, and the rows its next peer (rank + 1 mod P) wrote into that
    peer's block of a shared /dev/shm segment (mapped here, as a reader of published rows
    maps its owner's). Every rank reads while the others do, as in a layer of training.
    The two rates are measured back to back on the same rank, so their ratio is what reading
    in place adds to an SpMM (the cache lines move from the writer's core) and applies to
    the SpMM table at every working-set size."""

    widths: list[Width]
    """Row widths (elements) of the measurements, increasing."""
    working_bytes: Bytes
    """Bytes of the rows each SpMM gathers from (the same for both)."""
    local_edges_per_s: list[list[Rate]]
    """Per rank, per width: edges per second of the SpMM over rows of its own memory."""
    mapped_edges_per_s: list[list[Rate]]
    """Per rank, per width: edges per second of the SpMM over the peer's published rows."""

    @model_validator(mode="after")
    def _check(self) -> InPlaceRead:
        if not increasing(self.widths):
            raise ValueError("widths must be a non-empty increasing list")
        tables = (self.local_edges_per_s, self.mapped_edges_per_s)
        if len(tables[0]) != len(tables[1]) or any(
            len(row) != len(self.widths) for table in tables for row in table
        ):
            raise ValueError("local and mapped rates need one rate per rank and width")
        return self

    def slowdown(self, rank: int | None) -> float:
        """How many times an SpMM's time when its rows are read in place: the median over
        widths of the local rate over the mapped one (rank None: the largest over ranks). One
        number, not one per width: one SpMM timed once is noisy (per-width ratios of 0.8-1.4
        on this 2-core machine with 4 workers, around 1). At least 1: rows a peer wrote are
        never quicker to read than rows of one's own (the same bytes, fetched from farther),
        so a ratio below 1 is timing noise."""
        ranks = range(len(self.local_edges_per_s)) if rank is None else [rank]
        return max(
            1.0,
            *(
                statistics.median(
                    a / b
                    for a, b in zip(
                        self.local_edges_per_s[r], self.mapped_edges_per_s[r], strict=True
                    )
                )
                for r in ranks
            ),
        )


class Links(_Record):
    """The transports between workers; null when the probe ran a single worker."""

    gloo: LinkProfile | None
    """The process group (gloo `isend`/`irecv`, the pipeline's transport)."""
    shm: LinkProfile | None
    """A /dev/shm segment: write rows, barrier, a peer reads them (null across hosts). Its
    latency is the barrier's time, its bandwidth that of the copies in and out."""
    barrier_s: Seconds | None
    """Seconds of one `dist.barrier()` of all workers."""
    alltoall: LinkFit | None
    """gloo `all_to_all_single` with every worker at once (the blocking exchange): its
    bandwidth counts the bytes one worker receives from all peers together."""
    overlap: Share | None
    """Share of the shorter of a transfer (isend/irecv to every peer) and a computation (GEMMs)
    that hides behind the other when both run at once: 1 is perfect overlap, 0 none (they
    compete for the same cores)."""
    in_place: InPlaceRead | None = None
    """Rows read in place from a peer's published rows (null across hosts and with one
    worker: nothing is read in place there)."""


class ProbeLoad(_Record):
    """What else kept the machine busy while the probe measured it."""

    load_avg_1m: Load
    """The 1-minute load average when the probe ended (`os.getloadavg`), its own workers
    included."""
    other_cpu: Load | None
    """Cores other processes kept busy, on average over the probe: the machine's busy time
    (/proc/stat) less the probe's own CPU time; null where /proc/stat is missing."""
    num_cpus: Annotated[Whole, Field(ge=1, le=1 << 20)]
    """Cores of the machine (`os.cpu_count`)."""

    def high(self, share: float = HIGH_LOAD_SHARE) -> bool:
        """Other processes used more than `share` of the cores (or, without /proc/stat, the
        load average beyond the probe's workers did)."""
        other = self.other_cpu if self.other_cpu is not None else self.load_avg_1m
        return other > share * self.num_cpus


class RankRates(_Record):
    """Where one rank ran during the probe and what it measured there."""

    rank: Annotated[Whole, Field(ge=0, le=4095)]
    """Its global rank."""
    hostname: str
    """Its host."""
    cores: list[Annotated[Whole, Field(ge=0, le=1 << 20)]] | None
    """The cores it was pinned to (`launch.cpu_affinity`); null: not pinned."""
    threads: Annotated[Whole, Field(ge=1, le=4096)]
    """Its intra-op threads (`torch.get_num_threads()`)."""
    compute: ComputeRates
    """Its kernel rates, every rank measuring at once."""
    link: str | None = None
    """Its node's uplink rate where the node was emulated (`launch.emulate`: `1gbit`,
    `unlimited`); null on a real machine."""


def slowest_rates(ranks: list[ComputeRates]) -> ComputeRates:
    """Every rate of `ranks` at its lowest over the ranks (same widths and sizes)."""
    first, out = ranks[0], {}
    for name in ComputeRates.model_fields:
        values = [getattr(r, name) for r in ranks]
        if name in ("widths", "spmm_bytes", "pass_bytes"):
            out[name] = values[0]
        elif name.startswith("spmm"):
            out[name] = [
                [min(col) for col in zip(*rows, strict=True)] for rows in zip(*values, strict=True)
            ]
        else:
            out[name] = [min(col) for col in zip(*values, strict=True)]
    return first.model_copy(update=out)


class HardwareProfile(_Record):
    """Everything the probe measured on one or more machines with one worker count."""

    format_version: int
    """Version of this file's layout (FORMAT_VERSION)."""
    created_utc: str
    """When the probe ran (ISO 8601, UTC)."""
    hostname: str
    """Host of rank 0 (`ranks` has every rank's)."""
    device: str
    """Where the compute rates were measured (`cpu`)."""
    torch_version: str
    """torch.__version__ of the workers."""
    kernels_backend: str
    """`kernels.backend_name()`: `reference`, `cuda`, `cpu` or `cuda+cpu`."""
    dtype: Literal["float32", "float64"]
    """Element type of every measured row (`float32`); bytes per element follow from it."""
    world_size: Annotated[Whole, Field(ge=1, le=4096)]
    """Workers that ran the probe at once (`partition.num_parts`)."""
    threads_per_worker: Annotated[Whole, Field(ge=1, le=4096)]
    """Intra-op threads of rank 0 (`torch.get_num_threads()`, from OMP_NUM_THREADS or its
    cores); `ranks` has every rank's."""
    nnodes: Annotated[Whole, Field(ge=1, le=4096)] = 1
    """Machines the workers ran on (`launch.nnodes`)."""
    cpu_affinity: list[list[Annotated[Whole, Field(ge=0, le=1 << 20)]]] | None = None
    """`launch.cpu_affinity` of the probe's launch (null: workers not pinned)."""
    allocator: Literal["system", "jemalloc", "user"] = "system"
    """The workers' memory allocator (`launch.allocator`, launch/allocator.py): rates of fresh
    memory differ by several times between them, so a profile serves runs on the same one."""
    quick: StrictBool
    """Measured with the quick (test) sizes: rates are rough."""
    probe_s: Annotated[Finite, Field(ge=0, le=86400.0)]
    """Wall seconds rank 0 spent measuring (process start-up excluded)."""
    sizes: ProbeSizes
    """The work each measurement did."""
    compute: ComputeRates
    """Kernel rates per width: every rate the slowest rank's (`slowest_rates`)."""
    ranks: list[RankRates]
    """Every rank's placement and own rates, in rank order."""
    links: Links
    """Link fits between workers."""
    load: ProbeLoad | None = None
    """What else ran on the machine while the probe measured (null: not recorded)."""

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        links, world = self.links, self.world_size
        gloo = links.gloo
        group = (gloo, links.barrier_s, links.alltoall, links.overlap)
        if any((m is None) != (world == 1) for m in group):
            raise ValueError(
                "links.gloo, barrier_s, alltoall and overlap are measured iff world_size > 1"
            )
        for link in (gloo, self.links.shm):
            if link is not None and len(link.pairs) != world * (world - 1) // 2:
                raise ValueError(f"a link needs one pair fit per pair of the {world} workers")
            if link is not None and link.ranks is not None and len(link.ranks) != world:
                raise ValueError(f"a link's rank fits need one fit per worker ({world})")
        if links.in_place is not None and len(links.in_place.local_edges_per_s) != world:
            raise ValueError(f"links.in_place needs the rates of each of the {world} workers")
        if [r.rank for r in self.ranks] != list(range(world)):
            raise ValueError(f"ranks must list every rank of the {world} workers in order")
        return self

    def rank_compute(self, rank: int) -> ComputeRates:
        """Rank `rank`'s own compute rates.

        Raises:
            CacheError: the profile has no such rank (probed with fewer workers).
        """
        if not 0 <= rank < len(self.ranks):
            raise CacheError(
                f"The hardware profile has no rank {rank} (probed with {self.world_size} "
                "workers); probe again with the worker count you train with."
            )
        return self.ranks[rank].compute

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the measured rows."""
        return 8 if self.dtype == "float64" else 4

    # -- file ---------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON content; a plan made from another profile is stale.
        The system allocator is left out: profiles of before it was recorded keep their key
        (and so do the plans and the partitions weighed with them)."""
        content = self.model_dump(mode="json")
        if content.get("allocator") == "system":
            del content["allocator"]
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def write(self, path: Path) -> None:
        """Write the profile atomically (temporary file in the same folder, then rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # A fresh, uniquely named temporary file: the machine-wide cache may be shared.
        files.write_text(path, files.json_text(self.model_dump(mode="json"), indent=2) + "\n")

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
            why = first["msg"].removeprefix("Value error, ")  # our validators' own sentences
            raise CacheError(
                f"Hardware profile {path} is incomplete or invalid ({where}: {why}); {_REDO}."
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
