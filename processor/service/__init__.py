"""The service: ``processor run`` (a worker with its health and metrics endpoints),
``processor init``/``cancel``, and the option table of flags and environment variables."""
