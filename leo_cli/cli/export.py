"""`leo export`: a run's best-validation model as the state dict of PyG's model class."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from leo_cli.cli.common import console, handle_errors
from leo_cli.config import load_config
from leo_cli.errors import ConfigError, TrainError
from leo_cli.run_dir import RunDir
from leo_cli.util import files


@handle_errors
def export_cmd(
    run: Annotated[
        Path, typer.Argument(help="A run folder of leo train (holding checkpoints/best.pt).")
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="The file to write (torch.save).", show_default=False),
    ] = Path("model.pt"),
    to: Annotated[
        Literal["pyg"],
        typer.Option("--to", help="Whose model class the state dict is for."),
    ] = "pyg",
) -> None:
    """Write the best-validation model of a run as a state dict that
    torch_geometric.nn.models (GCN, GraphSAGE, GIN, GAT) load with strict=True, and print
    the call that builds the model.
    """
    folder = RunDir(run)
    if not folder.config.is_file():
        raise ConfigError(f"{run} is not a run folder of leo train (no {folder.config.name}).")
    cfg = load_config(folder.config)
    # here, once the run folder is read: torch and the models are not needed before
    import torch

    from leo_cli.models.export import to_pyg

    best = folder.read_best()
    try:
        exported = to_pyg(cfg.model, best["model"])
    except KeyError as exc:
        raise TrainError(
            f"{folder.best} does not hold a {cfg.model.name} model of {cfg.model.num_layers} "
            f"layers (no {exc}); export the run it was trained in."
        ) from None
    try:
        with files.atomic_file(out) as f:
            torch.save(exported.state, f)
    except OSError as exc:
        raise TrainError(
            f"--out {out} cannot be written ({exc.strerror}); choose another path."
        ) from None
    test = best.get("test_acc")
    shown = "-" if test is None else f"{100 * test:.2f}%"
    console.print(
        f"[green]Wrote[/] {escape(str(out))}: the model of epoch {best['epoch']} (best "
        f"validation accuracy; test accuracy {shown})."
    )
    console.print("Load it with:")
    console.print(
        f"  model = {escape(exported.call())}\n"
        f"  model.load_state_dict(torch.load({str(out)!r}), strict=True)",
        highlight=False,
    )
    console.print(
        "LEO trained on the undirected graph without self-loops: give the model "
        "torch_geometric.utils.remove_self_loops(to_undirected(edge_index))[0] for its numbers."
    )
