"""Passwords verified lately: a repeated login skips scrypt, and nothing else does.

The hashes are real scrypt hashes and the check is the real one; each test counts how
many times it ran, since skipping it is the point of the cache.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.api.identity.verified import VerifiedPasswords
from shared.passwords import hash_password, verify_password

ALICE, BOB, CAROL = "user-alice", "user-bob", "user-carol"
RIGHT, WRONG = "correct horse battery", "correct horse battery!"


class CountingCheck:
    """The real scrypt check, counting its runs; ``gate`` holds runs until it is set."""

    def __init__(self) -> None:
        self.runs = 0
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()

    def __call__(self, password: str, stored: str) -> bool:
        with self._lock:
            self.runs += 1
        self.gate.wait(timeout=10)
        return verify_password(password, stored)


@pytest.fixture(scope="module")
def stored() -> str:
    return hash_password(RIGHT)


@pytest.fixture
def check() -> CountingCheck:
    return CountingCheck()


@pytest.fixture
def verified(check: CountingCheck) -> VerifiedPasswords:
    return VerifiedPasswords(verifier=check)


async def test_a_repeated_login_with_the_same_password_skips_scrypt(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    assert check.runs == 1
    for _ in range(3):
        assert await verified.verify(ALICE, stored, RIGHT)
    assert check.runs == 1


async def test_a_wrong_password_is_never_served_from_the_cache(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    for given in (WRONG, RIGHT[:-1], RIGHT.upper(), ""):
        assert not await verified.verify(ALICE, stored, given)
    assert check.runs == 5
    # A failure is not remembered either way, and the right password is still known.
    assert not await verified.verify(ALICE, stored, WRONG)
    assert check.runs == 6
    assert await verified.verify(ALICE, stored, RIGHT)
    assert check.runs == 6


async def test_a_new_stored_hash_makes_the_old_password_go_through_scrypt(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    changed = hash_password("a new password")
    assert not await verified.verify(ALICE, changed, RIGHT)
    assert check.runs == 2
    assert await verified.verify(ALICE, changed, "a new password")
    assert await verified.verify(ALICE, changed, "a new password")
    assert check.runs == 3
    # Same password set again: a new salt, a new hash, so scrypt once more.
    again = hash_password(RIGHT)
    assert await verified.verify(ALICE, again, RIGHT)
    assert check.runs == 4


async def test_one_users_entry_never_serves_another_user(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    # Bob with the very same hash (say, copied) still pays scrypt the first time.
    assert await verified.verify(BOB, stored, RIGHT)
    assert check.runs == 2


async def test_forgetting_a_user_disabled_makes_their_next_login_pay_scrypt(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    assert await verified.verify(BOB, stored, RIGHT)
    verified.forget(ALICE)
    verified.forget("nobody")
    assert len(verified) == 1
    assert await verified.verify(ALICE, stored, RIGHT)
    assert await verified.verify(BOB, stored, RIGHT)
    assert check.runs == 3


async def test_the_cache_is_bounded_least_recently_used_first(
    check: CountingCheck, stored: str
) -> None:
    verified = VerifiedPasswords(max_entries=2, verifier=check)
    assert await verified.verify(ALICE, stored, RIGHT)
    assert await verified.verify(BOB, stored, RIGHT)
    assert await verified.verify(ALICE, stored, RIGHT)  # Alice used last: Bob goes next
    assert await verified.verify(CAROL, stored, RIGHT)
    assert len(verified) == 2
    assert check.runs == 3
    assert await verified.verify(ALICE, stored, RIGHT)
    assert check.runs == 3
    assert await verified.verify(BOB, stored, RIGHT)
    assert check.runs == 4


async def test_only_a_keyed_digest_is_kept(verified: VerifiedPasswords, stored: str) -> None:
    assert await verified.verify(ALICE, stored, RIGHT)
    [kept] = verified._entries.values()
    assert len(kept) == 32
    assert RIGHT.encode() not in kept
    # Another process (another key) keeps another digest for the same triple.
    other = VerifiedPasswords()
    assert await other.verify(ALICE, stored, RIGHT)
    assert next(iter(other._entries.values())) != kept


async def test_two_logins_at_once_share_one_scrypt_run(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    check.gate.clear()
    both = asyncio.gather(*(verified.verify(ALICE, stored, RIGHT) for _ in range(2)))
    await asyncio.sleep(0.05)
    check.gate.set()
    assert await both == [True, True]
    assert check.runs == 1


async def test_a_right_and_a_wrong_password_at_once_are_each_answered_for_themselves(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    answers = await asyncio.gather(
        verified.verify(ALICE, stored, WRONG),
        verified.verify(ALICE, stored, RIGHT),
        verified.verify(ALICE, stored, WRONG),
    )
    assert list(answers) == [False, True, False]
    assert check.runs == 2  # the two identical wrong ones shared a run
    assert await verified.verify(ALICE, stored, RIGHT)
    assert not await verified.verify(ALICE, stored, WRONG)
    assert check.runs == 3


async def test_a_login_cut_off_mid_check_leaves_the_answer_to_the_other(
    verified: VerifiedPasswords, check: CountingCheck, stored: str
) -> None:
    check.gate.clear()
    first = asyncio.create_task(verified.verify(ALICE, stored, RIGHT))
    second = asyncio.create_task(verified.verify(ALICE, stored, RIGHT))
    await asyncio.sleep(0.05)
    first.cancel()
    check.gate.set()
    assert await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await verified.verify(ALICE, stored, RIGHT)
    assert check.runs == 1
