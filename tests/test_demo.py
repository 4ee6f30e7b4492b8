"""`processor demo` (the README's run command) works on an embedded Redis."""

from __future__ import annotations

import subprocess
import sys


def test_demo_prints_three_turns_with_their_outcomes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "processor.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "== demo-handoff: completed" in out
    assert "== demo-cancel: cancelled" in out
    assert "== demo-error: error" in out
    assert "producer_error: model quota exceeded" in out
    # Bob's two deltas joined in one message although Alice spoke between them.
    assert "Hi, I'm Bob from billing. Your invoice #42 was paid on May 3." in out
    assert "started an embedded redis-server" in proc.stderr
