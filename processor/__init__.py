"""processor: merge streaming AI agent output from Redis Streams into final responses."""

__version__ = "0.1.0"
