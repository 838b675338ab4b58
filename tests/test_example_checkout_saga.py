"""``examples/checkout_saga.py`` runs on the embedded default: one order completes, the
other is compensated (refund, then release), and the stock adds up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "checkout_saga.py"


def test_the_checkout_saga_example(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLBROKER_")}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--db", str(tmp_path / "checkout.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "checkout: order-1=completed order-2=compensated"
    assert sorted(line for line in lines if line.startswith("payments:")) == [
        "payments: charge 19.80 for order-1",
        "payments: charge 29.70 for order-2",
        "payments: refund pay-order-2",
    ]
    assert "stock of mugs: 8 (10 - 2 shipped)" in lines
