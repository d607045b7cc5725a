"""TaskHost (mqproxy.runtime.tasks): a connection's tasks in a shared nursery, with a nursery's contract."""

from __future__ import annotations

import trio
import trio.testing

from mqproxy.runtime.tasks import TaskHost


async def test_cancel_and_join_end_every_task_without_touching_the_host_nursery() -> None:
    ended: list[str] = []
    async with trio.open_nursery() as host_nursery:
        host = TaskHost(host_nursery, lambda exc: None)

        async def forever(name: str) -> None:
            try:
                await trio.sleep_forever()
            finally:
                ended.append(name)

        host.start_soon(forever, "a")
        host.start_soon(forever, "b")
        await trio.testing.wait_all_tasks_blocked()
        host.cancel()
        await host.join()
        assert sorted(ended) == ["a", "b"]
        assert host.error is None
        host_nursery.start_soon(trio.sleep, 0)  # the host nursery was not cancelled
    assert not host_nursery.cancel_scope.cancel_called


async def test_a_task_error_is_kept_and_reported_not_raised_into_the_host_nursery() -> None:
    reported: list[BaseException] = []
    async with trio.open_nursery() as host_nursery:
        host = TaskHost(host_nursery, reported.append)

        async def broken() -> None:
            raise ValueError("bug")

        host.start_soon(broken)
        await host.join()
    assert isinstance(host.error, ValueError)
    assert reported == [host.error]


async def test_join_without_tasks_returns_and_a_task_started_after_cancel_does_not_run() -> None:
    ran: list[bool] = []
    async with trio.open_nursery() as host_nursery:
        host = TaskHost(host_nursery, lambda exc: None)
        await host.join()
        host.cancel()

        async def work() -> None:
            await trio.lowlevel.checkpoint()
            ran.append(True)

        host.start_soon(work)
        await host.join()
    assert ran == []
