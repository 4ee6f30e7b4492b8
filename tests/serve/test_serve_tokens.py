"""Turn tokens (processor/serve/tokens.py): a token lets its bearer read the
one turn it names, until it expires, and nothing else; whatever else is
presented is refused with its reason, never an exception."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from support.worker_harness import ROOT

from processor.serve.tokens import MIN_SECRET_LENGTH, Verdict, issue, verify

secrets = st.text(min_size=MIN_SECRET_LENGTH, max_size=64)
response_ids = st.text(min_size=1, max_size=80)
times = st.integers(min_value=0, max_value=2**40)
PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(secrets, response_ids, times, st.integers(min_value=1, max_value=10**9))
def test_a_token_opens_its_turn_until_it_expires(secret, rid, now, ttl) -> None:
    token = issue(secret, rid, now + ttl)
    assert verify(secret, token, rid, now) is Verdict.OK
    assert verify(secret, token, rid, now + ttl - 0.5) is Verdict.OK
    assert verify(secret, token, rid, now + ttl) is Verdict.EXPIRED
    assert verify(secret, token, rid, now + ttl + 10**6) is Verdict.EXPIRED


@PROPERTY
@given(secrets, response_ids, response_ids, times)
def test_a_token_of_another_turn_is_forbidden(secret, rid, other, now) -> None:
    token = issue(secret, rid, now + 60)
    expected = Verdict.OK if other == rid else Verdict.FORBIDDEN
    assert verify(secret, token, other, now) is expected


@PROPERTY
@given(secrets, secrets, response_ids, times)
def test_a_token_of_another_secret_is_bad(secret, other, rid, now) -> None:
    token = issue(other, rid, now + 60)
    expected = Verdict.OK if other == secret else Verdict.BAD
    assert verify(secret, token, rid, now) is expected


@PROPERTY
@given(secrets, response_ids, times, st.data())
def test_any_change_to_a_token_is_refused(secret, rid, now, data) -> None:
    token = issue(secret, rid, now + 60)
    at = data.draw(st.integers(min_value=0, max_value=len(token) - 1))
    replacement = data.draw(st.characters(codec="ascii").filter(lambda c: c != token[at]))
    changed = token[:at] + replacement + token[at + 1:]
    assert verify(secret, changed, rid, now) is Verdict.BAD
    assert verify(secret, token[:at], rid, now) in (Verdict.BAD, Verdict.MISSING)
    assert verify(secret, token + replacement, rid, now) is Verdict.BAD


@PROPERTY
@given(secrets, response_ids, st.one_of(st.text(max_size=200), st.binary(max_size=60).map(
    lambda b: "v1." + b.hex() + "." + b.hex())))
def test_anything_else_is_refused_without_an_exception(secret, rid, garbage) -> None:
    verdict = verify(secret, garbage, rid, 0)
    assert verdict in (Verdict.MISSING, Verdict.BAD)
    assert (verdict is Verdict.MISSING) == (garbage == "")


def test_missing_tokens_and_the_statuses_of_refusals() -> None:
    assert verify("s" * 16, None, "r", 0) is Verdict.MISSING
    assert verify("s" * 16, "", "r", 0) is Verdict.MISSING
    assert [v.status for v in Verdict] == [200, 401, 401, 401, 403]


def test_signed_claims_of_the_wrong_shape_are_bad() -> None:
    """A MAC that matches over a payload that is not {rid: str, exp: int}."""
    import base64
    import hashlib
    import hmac

    secret = "k" * 20

    def signed(payload: bytes) -> str:
        text = "v1." + base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        mac = hmac.new(secret.encode(), text.encode(), hashlib.sha256).digest()
        return text + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    for payload in (b"[]", b"7", b"{}", b'{"rid": 1, "exp": 5}', b'{"rid": "r", "exp": "5"}',
                    b'{"rid": "r", "exp": true}', b"not json", b'{"rid": "r", "exp": 1.5}'):
        assert verify(secret, signed(payload), "r", 0) is Verdict.BAD, payload
    assert verify(secret, signed(b'{"rid": "r", "exp": 5}'), "r", 0) is Verdict.OK


def test_processor_token_prints_a_token_on_its_last_line() -> None:
    secret = "a-test-secret-of-some-length"
    done = subprocess.run([sys.executable, "-m", "processor.cli", "token", "turn-7",
                           "--secret", secret, "--ttl", "120"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    token = done.stdout.splitlines()[-1]
    import time

    assert verify(secret, token, "turn-7", time.time()) is Verdict.OK
    assert verify(secret, token, "turn-7", time.time() + 121) is Verdict.EXPIRED
    short = subprocess.run([sys.executable, "-m", "processor.cli", "token", "t", "--secret",
                            "short", "--ttl", "0"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, env={"PATH": "/usr/bin:/bin"})
    assert short.returncode == 2 and short.stdout == ""
    assert short.stderr.splitlines() == [
        f"processor token: the secret must be at least {MIN_SECRET_LENGTH} characters",
        "processor token: --ttl must be at least 1, got 0",
    ]


def test_only_the_canonical_spelling_of_a_mac_is_accepted() -> None:
    """Base64 without padding leaves spare bits in the last character: a MAC
    spelled with other spare bits decodes to the same bytes, and must still
    be refused (a token has one spelling)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    secret = "s" * 16
    token = issue(secret, "r", 100)
    accepted = [c for c in alphabet if verify(secret, token[:-1] + c, "r", 0) is Verdict.OK]
    assert accepted == [token[-1]]
