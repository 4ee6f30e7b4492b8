"""``processor serve``: turns streamed to UIs over HTTP (docs/serve.md).

Stateless: everything is read from Redis, so any number of replicas serve
any turn. It reads the outputs the workers publish and imports none of the
worker's modules: only the contract's (keys, ids), the connection helpers
and ``processor.client``. Nothing imports this package but the command line.

- ``tokens``, ``sse``, ``turns``: pure (tokens, event-stream framing, the
  seq order a stream keeps).
- ``source``: where a turn's past is read (joins and resumes).
- ``hub``: the live feed, one reader per shard fanning out to the streams.
- ``app``: the HTTP routes; ``config`` its options; ``run`` the process.
"""
