"""``processor serve``: turns streamed to UIs over HTTP (docs/serve.md).

Stateless: everything is read from Redis, so any number of replicas serve
any turn. It reads the outputs the workers publish and imports none of the
worker's modules: only the contract's (keys, ids, models), the connection
helpers, ``processor.client`` (with what a stream is made of and the seq
order it keeps, ``client.turns``, and where a turn's past is read,
``client.source``: ``Subscriber.follow`` shares them) and the pure AG-UI
rendering (``processor.engine.agui``). Nothing imports this package but
the command line.

- ``tokens``, ``sse``, ``formats``: pure (tokens, event-stream framing,
  native or AG-UI events).
- ``hub``: the live feed, one reader per shard fanning out to the streams.
- ``edge``: what the handlers share: the server, error answers, tokens,
  CORS and the middlewares; ``run_input``: an AG-UI client's posted body.
- ``stream``: one turn's event stream, its join and its end; ``page``: the
  watch page.
- ``app``: the HTTP routes; ``config`` its options; ``run`` the process.
"""
