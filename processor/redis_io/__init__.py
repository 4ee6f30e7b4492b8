"""Redis I/O without domain knowledge: connecting (standalone, Cluster, TLS), retrying,
and parsing stream replies."""
