"""The worker: one process that merges the shards it owns (membership, one loop per
shard, recovery of other workers' pending entries), with the held path (turns held in
memory, :mod:`processor.worker.held`) and the stored path (turns stored in Redis,
:mod:`processor.worker.stored`)."""
