"""The worker: one process that merges the shards it owns (membership, one loop per
shard, recovery of other workers' pending entries), with the held path (turns held in
memory, ``processor.worker.held``) and the stored path (turns stored in Redis,
``processor.worker.stored``)."""
