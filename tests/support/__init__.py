"""The suite's helpers, shared by the test rooms (tests/engine, tests/worker,
tests/serve, ...): imported as ``support.<module>`` (pyproject's
``pythonpath`` puts tests/ on ``sys.path``; the fixtures are tests/conftest.py's).

- Live runs: ``worker_harness`` (workers on a real Redis; every output goes
  through ``contract``; ``held_runs`` for held turns; ``no_redis`` for a
  worker that never reaches Redis), ``subprocess_workers``,
  ``serve_harness``, ``view_pages`` (the page in headless Chromium),
  ``sse_followers``, ``node_clients`` (the JavaScript clients in tests/js),
  ``cli_tools``, ``scrape`` (a worker's metrics), ``records``,
  ``loss_runs`` (the loss tests' entries and reads).
- Deployment: ``deploy_files`` (compose, the Dockerfile, the manifests).
- Redis: ``redis_servers`` (the fixtures' servers, a local Cluster),
  ``tls_certs``, ``tls_proxy``.
- Turns and their checks: ``turn_reference``, ``strategies``, ``merging``,
  ``expectations`` and ``live_scenarios`` (tests/data/scenarios),
  ``delta_oracle``, ``agui_checks``, ``ui_messages``, ``bad_entries``,
  ``big_entries``, ``memory_runs``.
- The chaos soak: ``chaos``, ``chaos_plan``, ``chaos_checks``.
- ``agui_chat_client.py`` is a script run in a venv of its own, never imported.
"""
