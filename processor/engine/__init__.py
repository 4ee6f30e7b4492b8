"""The merge engine: a turn's state, the fold of records into it, its life (limits,
verdicts), its outputs (events, AG-UI, rendering a finished turn) and the offline merge.
Pure: imports nothing of Redis."""
