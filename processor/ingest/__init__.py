"""Ingest: a stream entry's fields to a validated record (decode, validate, the .NET
shape of updates, the routing fields). Pure: imports nothing of Redis."""
