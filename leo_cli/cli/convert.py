"""`leo convert`: your own graph (edge list, networkx file, PyG dict or DGL file) to LEO's
`.npz`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from leo_cli.cli.common import console, handle_errors


@handle_errors
def convert_cmd(
    edges: Annotated[
        Path | None,
        typer.Argument(
            help="Edge list (two integer columns 0..N-1: CSV, TSV or whitespace, header "
            "optional, `#` comments) or a graph file networkx reads (.graphml, .gml, .gexf, "
            ".net, .adjlist: labels from the `y`, `label` or `class` node attribute (GML, "
            "GEXF: `y` or `class`, their `label` names the node), features from "
            "`x` or the numeric attributes).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The .npz file to write.", show_default=False)
    ] = Path("graph.npz"),
    features: Annotated[
        Path | None,
        typer.Option(
            "--features",
            help="N x F node features: .npy or CSV (one row per node, in order).",
            show_default=False,
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            "--labels",
            help="Labels: .npy (N integers) or CSV (one label per node in order, or two "
            "columns node,label; nodes without a label stay out of every mask).",
            show_default=False,
        ),
    ] = None,
    masks: Annotated[
        Path | None,
        typer.Option(
            "--masks",
            help="An .npz with train_mask, val_mask and test_mask (bool, N each).",
            show_default=False,
        ),
    ] = None,
    split: Annotated[
        str,
        typer.Option(
            "--split",
            help="Without masks: random train,val,test fractions of the labelled nodes.",
        ),
    ] = "0.6,0.2,0.2",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random split.")] = 0,
    from_pyg: Annotated[
        Path | None,
        typer.Option(
            "--from-pyg",
            help="Instead of EDGES: a dict of tensors saved with torch.save (edge_index, x, "
            "y, train_mask, val_mask, test_mask), read with weights_only=True.",
            show_default=False,
        ),
    ] = None,
    from_dgl: Annotated[
        Path | None,
        typer.Option(
            "--from-dgl",
            help="Instead of EDGES: a file dgl.save_graphs wrote (its first graph; node data "
            "feat, label, train_mask, val_mask, test_mask). Needs DGL installed.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write your graph in LEO's .npz format (datasets/npz.md), then train on it with
    leo train --set data.name=OUT.npz.

    The graph is made symmetric when loaded (duplicates merged, self-loops dropped); the file
    is checked by LEO's own loader before it takes its name.
    """
    # here, not at the top: the graph modules import numpy, which `leo --help` does not need
    from leo_cli.graph.convert import convert, parse_split, read_source

    found = read_source(edges, from_pyg, from_dgl)
    fractions = parse_split(split)
    graph, notes = convert(found, out, features, labels, masks, fractions, seed)
    table = Table(title=f"[bold]{escape(str(out))}[/]", title_justify="left")
    for column in ("nodes", "edges (both directions)", "features", "classes", "train / val / test"):
        table.add_column(column, justify="right")
    split_counts = " / ".join(
        str(int(m.sum())) for m in (graph.train_mask_N, graph.val_mask_N, graph.test_mask_N)
    )
    table.add_row(
        f"{graph.num_nodes:,}", f"{graph.edge_index_2E.shape[1]:,}",
        str(graph.x_NF.shape[1]), str(graph.num_classes), split_counts,
    )  # fmt: skip
    console.print(table)
    for note in notes:
        console.print(f"[yellow]Note:[/] {escape(note)}")
    console.print(f"Train on it: leo train --set data.name={escape(str(out))}")
