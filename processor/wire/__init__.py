"""The wire contract: the records and entries on the streams (models, schema), turn and
response ids, the stream ids, and the Redis key names (the only place they are built).
Pure: imports nothing of Redis."""
