"""The command line: ``processor <command>`` and the operator tools (stats, tail,
capture, dlq, repair-stream, demo)."""
