"""A stop that overruns (``lifecycle/shutdown_watch.py``): reported with what is pending, then ended hard;
a stop in time disarms both."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gwtfp2p.daemon.lifecycle.shutdown_watch import ShutdownWatch, pending_report

WAIT_S = 5.0  # deadline of every wait below


class FakeHardExit:
    def __init__(self) -> None:
        self.armed_after_s: float | None = None
        self.cancelled = False

    def arm(self, after_s: float) -> None:
        self.armed_after_s = after_s

    def cancel(self) -> None:
        self.cancelled = True


async def stuck_in_close(never: asyncio.Event) -> None:
    await wait_for_peer(never)


async def wait_for_peer(never: asyncio.Event) -> None:
    await never.wait()


async def until(predicate, timeout_s: float = WAIT_S) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


def test_a_stop_that_overruns_logs_the_pending_tasks_and_arms_the_hard_exit(caplog: pytest.LogCaptureFixture):
    async def main() -> FakeHardExit:
        hard = FakeHardExit()
        watch = ShutdownWatch(0.01, backstop_s=3.0, hard_exit=hard)
        stop, never = asyncio.Event(), asyncio.Event()
        watching = asyncio.create_task(watch.arm_on(stop))
        stuck = asyncio.create_task(stuck_in_close(never), name="transport close")
        stop.set()
        await until(lambda: watch.overran)
        stuck.cancel()
        await asyncio.gather(watching, stuck, return_exceptions=True)
        return hard

    with caplog.at_level(logging.ERROR, logger="gwtfp2p.daemon.lifecycle.shutdown_watch"):
        hard = asyncio.run(main())
    assert hard.armed_after_s == pytest.approx(3.01)
    assert not hard.cancelled
    report = caplog.text
    assert "still stopping 0 s after the stop signal" in report and "exiting in 3 s" in report
    assert "[transport close]" in report  # the task, then every coroutine down to the line it waits at
    assert "in stuck_in_close: await wait_for_peer(never)" in report
    assert "in wait_for_peer: await never.wait()" in report


def test_a_stop_in_time_disarms_the_report_and_the_hard_exit():
    async def main() -> tuple[ShutdownWatch, FakeHardExit]:
        hard = FakeHardExit()
        watch = ShutdownWatch(0.05, hard_exit=hard)
        stop = asyncio.Event()
        watching = asyncio.create_task(watch.arm_on(stop))
        stop.set()
        await until(lambda: hard.armed_after_s is not None)
        watch.disarm()
        watching.cancel()
        await asyncio.sleep(0.1)  # past the deadline the timer would have fired at
        return watch, hard

    watch, hard = asyncio.run(main())
    assert hard.cancelled and not watch.overran


def test_a_node_never_asked_to_stop_arms_nothing():
    async def main() -> FakeHardExit:
        hard = FakeHardExit()
        watch = ShutdownWatch(0.01, hard_exit=hard)
        watching = asyncio.create_task(watch.arm_on(asyncio.Event()))
        await asyncio.sleep(0)
        watching.cancel()
        watch.disarm()
        await asyncio.gather(watching, return_exceptions=True)
        return hard

    hard = asyncio.run(main())
    assert hard.armed_after_s is None and not hard.cancelled


def test_the_report_names_only_the_tasks_not_done():
    async def main() -> str:
        never = asyncio.Event()
        done = asyncio.create_task(asyncio.sleep(0), name="finished")
        await done
        stuck = asyncio.create_task(stuck_in_close(never), name="dht shutdown")
        await asyncio.sleep(0)
        report = pending_report([done, stuck])
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        return report

    report = asyncio.run(main())
    assert "[dht shutdown]" in report and "stuck_in_close" in report
    assert "finished" not in report
    assert pending_report([]) == "(none)"
