"""The execute/rollback contract of conductor tasks."""

from __future__ import annotations

import pytest

from services.conductor.workflow import TaskBase
from shared.exceptions import KeelError, MessagingTimeout, NoValidHost


class _Task(TaskBase):
    """Adds steps to ``done``; its rollback takes them back in reverse."""

    name = "test"

    def __init__(
        self, failure: Exception | None, *, rollback_fails: Exception | None = None
    ) -> None:
        self.failure = failure
        self.rollback_fails = rollback_fails
        self.done: list[str] = []
        self.rolled_back_for: Exception | None = None

    async def execute(self) -> None:
        self.done.append("claimed")
        if self.failure is not None:
            raise self.failure
        self.done.append("sent")

    async def rollback(self, exc: KeelError) -> None:
        self.rolled_back_for = exc
        if self.rollback_fails is not None:
            raise self.rollback_fails
        self.done.clear()


async def test_success_leaves_the_work_done() -> None:
    task = _Task(None)
    await task.run()
    assert task.done == ["claimed", "sent"]
    assert task.rolled_back_for is None


async def test_expected_error_is_rolled_back_and_handled() -> None:
    error = NoValidHost("There are not enough hosts available.")
    task = _Task(error)
    await task.run()
    assert task.done == []
    assert task.rolled_back_for is error


async def test_unexpected_error_is_rolled_back_then_raised() -> None:
    task = _Task(ValueError("bug"))
    with pytest.raises(ValueError, match="bug"):
        await task.run()
    assert task.done == []


async def test_transient_error_is_raised_untouched_for_another_delivery() -> None:
    error = MessagingTimeout("no reply from scheduler within 60s")
    task = _Task(error)
    with pytest.raises(MessagingTimeout):
        await task.run()
    assert task.done == ["claimed"]
    assert task.rolled_back_for is None


async def test_rollback_that_fails_is_raised_so_the_message_is_tried_again() -> None:
    # The rollback could not reach the database: raising its error (transient) has the
    # message delivered again, instead of leaving the instance half handled.
    task = _Task(NoValidHost("full"), rollback_fails=OSError("connection refused"))
    with pytest.raises(OSError, match="connection refused") as raised:
        await task.run()
    assert isinstance(raised.value.__context__, NoValidHost)
