"""The requestState tokens of the 2026-07-28 input rounds the gateway answers part of
(mcpcreds.gateway.input_rounds), on a fake clock: taken once, by the caller that got them, within
their time; the table bounded."""

from __future__ import annotations

from mcpcreds.gateway.input_rounds import PREFIX, InputRounds

ME = ("crm", 1000, None)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_gives_back_the_servers_state_and_the_answers_once_to_its_holder() -> None:
    rounds = InputRounds(Clock())
    token = rounds.hold(ME, "server-state", {"ask": {"action": "decline"}})
    assert token.startswith(PREFIX) and "server-state" not in token
    assert rounds.take(("crm", 1000, "grant-1"), token) is None  # another caller (a grant) gets nothing
    assert rounds.take(ME, token) == ("server-state", {"ask": {"action": "decline"}})
    assert rounds.take(ME, token) is None  # used
    assert rounds.take(ME, PREFIX + "made-up") is None


def test_a_token_expires_and_the_table_is_bounded() -> None:
    clock = Clock()
    rounds = InputRounds(clock, ttl=60, limit=2)
    old = rounds.hold(ME, None, {})
    clock.now += 61
    assert rounds.take(ME, old) is None  # expired
    tokens = [rounds.hold(ME, n, {}) for n in range(3)]
    assert len(rounds) == 2 and rounds.take(ME, tokens[0]) is None  # the oldest went
    assert rounds.take(ME, tokens[2]) == (2, {})
