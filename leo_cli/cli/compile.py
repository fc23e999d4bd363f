"""`leo compile`: build the CUDA extension leo_cli._C or (--cpu) LEO's CPU kernels, or (--check)
prove the CUDA kernels compile."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from leo_cli.cli.common import ConfigOpt, SetOpt, console, handle_errors, resolve_config
from leo_cli.errors import KernelError

if TYPE_CHECKING:
    from leo_cli.kernel_tools import check

# The kernels' modules import torch: they are imported where the command acts (after the
# config is read), so that `leo --help` and refused inputs answer without it.

_STATUS_STYLE = {"OK": "green", "FAIL": "bold red", "SKIP": "yellow"}


@handle_errors
def compile_cmd(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    check_only: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only prove the CUDA sources compile: nvcc -c every cuda/kernels/*.cu for each "
            "--arch (warnings are errors) into a temporary folder, and syntax-check the torch "
            "binding with the host compiler. Needs nvcc, not a GPU or a CUDA build of torch. "
            "Exits non-zero if anything fails.",
        ),
    ] = False,
    cpu: Annotated[
        bool,
        typer.Option(
            "--cpu",
            help="Build LEO's CPU kernels (cuda/cpu/: the CSR SpMM that serves CPU tensors) into "
            "leo_cli/_leo_cpu.so with the host C++ compiler and ninja; no GPU, nvcc or CUDA "
            "torch needed. `import leo_cli.kernels` then loads it unless LEO_KERNELS=ref.",
        ),
    ] = False,
    arch: Annotated[
        list[str] | None,
        typer.Option(
            "--arch",
            help="With --check: an architecture to compile for (80, sm_90, 9.0, 90a); "
            "repeatable. Default: 80 and 90. Without --check the build follows "
            "TORCH_CUDA_ARCH_LIST, else the visible GPUs.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Rebuild even when the last build's stamp matches: the sources, torch/CUDA "
            "versions and architecture list (with --cpu: cuda/cpu/, torch, Python, flags).",
        ),
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="With --check: compilations to run at once (default: one per CPU).",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Show the full compiler output (the build streams it; --check prints every "
            "log, not only the failures).",
        ),
    ] = False,
) -> None:
    """Build the CUDA kernels in cuda/ into leo_cli._C (cached), or --check that they compile;
    --cpu builds LEO's CPU kernels instead.

    The CUDA build needs a CUDA build of torch and nvcc, and installs leo_cli/_C*.so; the CPU
    build needs a C++ compiler and installs leo_cli/_leo_cpu.so.
    `import leo_cli.kernels` then loads them, unless LEO_KERNELS=ref.
    --config and --set are accepted like every command's; no config section affects compiling.
    """
    resolve_config(config, overrides)
    from leo_cli.kernels import stamp

    cuda_dir = stamp.cuda_source_dir()
    if cpu and (check_only or arch or jobs):
        raise KernelError(
            "--cpu builds the CPU kernels; --check, --arch and --jobs apply to CUDA only"
        )
    if cpu:
        _run_cpu_build(cuda_dir, force, verbose)
    elif check_only:
        _run_check(cuda_dir, arch, jobs, verbose)
    else:
        if arch:
            raise KernelError("--arch applies to --check; for the build set TORCH_CUDA_ARCH_LIST")
        _run_build(cuda_dir, force, verbose)


def _run_check(cuda_dir: Path, arch: Sequence[str] | None, jobs: int | None, verbose: bool) -> None:
    from leo_cli.kernel_tools import build, check

    archs = [check.normalize_arch(a) for a in arch] if arch else list(check.CHECK_ARCHS)
    nvcc = build.find_nvcc()
    console.print(f"Compiling {cuda_dir} with {nvcc} for {', '.join('sm_' + a for a in archs)}")
    total = len(build.kernel_sources(cuda_dir)) + len(build.binding_sources(cuda_dir))
    with _check_progress(total) as on_result:
        results = check.check_sources(cuda_dir, archs, jobs=jobs, on_result=on_result)
    console.print(_results_table(results))
    _print_logs(results, verbose)
    failed = [r for r in results if r.status == "FAIL"]
    if failed:
        names = ", ".join(f"{r.source} ({r.target})" for r in failed)
        raise KernelError(
            f"{len(failed)} of {len(results)} compilations failed: {names} (output above)"
        )
    skipped = sum(r.status == "SKIP" for r in results)
    note = f" ({skipped} skipped, reason above)" if skipped else ""
    console.print(f"[green]All {len(results) - skipped} compilations passed.[/]{note}")


@contextmanager
def _check_progress(total: int) -> Iterator[check.ResultCallback]:
    progress = Progress(
        SpinnerColumn(),
        TextColumn("compiling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("compile", total=total)

    def on_result(result: check.CheckResult) -> None:
        progress.advance(task)

    with progress:
        yield on_result


def _results_table(results: Sequence[check.CheckResult]) -> Table:
    table = Table(title="leo compile --check")
    table.add_column("source")
    table.add_column("target")
    table.add_column("result")
    table.add_column("seconds", justify="right")
    for r in results:
        style = _STATUS_STYLE[r.status]
        table.add_row(r.source, r.target, f"[{style}]{r.status}[/]", f"{r.seconds:.1f}")
    return table


def _print_logs(results: Sequence[check.CheckResult], verbose: bool) -> None:
    """Compiler output of failures (tail) and skip reasons; every log with --verbose."""
    from leo_cli.kernel_tools import check

    for r in results:
        show = r.status != "OK" or (verbose and r.log)
        if not show:
            continue
        style = _STATUS_STYLE[r.status]
        console.rule(f"[{style}]{r.status}[/] {escape(r.source)} ({r.target})")
        text = r.log if verbose else check.log_tail(r.log)
        console.print(escape(text), highlight=False, soft_wrap=True)


def _run_build(cuda_dir: Path, force: bool, verbose: bool) -> None:
    from leo_cli.kernel_tools import build

    if verbose:
        result = build.build_extension(cuda_dir, force=force, verbose=True)
    else:
        with console.status("Building leo_cli._C (nvcc + host compiler; a few minutes)..."):
            result = build.build_extension(cuda_dir, force=force)
    if result.cached:
        console.print(
            f"[green]Up to date:[/] {result.path} (sources, torch and archs {result.arch_list} "
            "unchanged; --force rebuilds)."
        )
    else:
        console.print(
            f"[green]Built[/] {result.path} for {result.arch_list} in {result.seconds:.0f} s."
        )


def _run_cpu_build(cuda_dir: Path, force: bool, verbose: bool) -> None:
    from leo_cli.kernel_tools import build_cpu
    from leo_cli.kernels import cpu as cpu_kernels

    if verbose:
        result = build_cpu.build_cpu_kernels(cuda_dir, force=force, verbose=True)
    else:
        with console.status(f"Building {cpu_kernels.LIBRARY} (host C++ compiler; ~20 s)..."):
            result = build_cpu.build_cpu_kernels(cuda_dir, force=force)
    if result.cached:
        console.print(
            f"[green]Up to date:[/] {result.path} (sources, torch and flags unchanged; "
            "--force rebuilds)."
        )
    else:
        console.print(f"[green]Built[/] {result.path} in {result.seconds:.0f} s.")
