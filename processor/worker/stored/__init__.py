"""The stored path: turns whose records are stored in Redis (``apply_entries``),
finalised from a replay of them (``finalise_turns``), and compacted."""
