"""curves.png: drawn from the metrics rows, without pyplot (a worker pays its import)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_curves_are_a_png_drawn_without_pyplot(tmp_path: Path) -> None:
    out = tmp_path / "curves.png"
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from leo_cli.worker.report import plot_curves

        rows = [
            {{"epoch": e, "loss": 2.0 / e, "train_acc": 0.5, "val_acc": 0.4, "test_acc": 0.3}}
            for e in range(1, 6)
        ]
        rows.append({{"epoch": 6, "loss": 0.3}})  # an epoch without evaluation
        plot_curves(rows, Path({str(out)!r}))
        assert "matplotlib.pyplot" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))
