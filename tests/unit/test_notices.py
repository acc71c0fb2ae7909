"""The metadata server's preemption and maintenance notices, read through long polls of the stand-in server
(tests/metadata.py), and the hosts that have a metadata server to ask."""

from __future__ import annotations

import selectors
import time
from pathlib import Path

import pytest
from metadata import REDIRECT_TARGET, serve_metadata

from xlarun.host.devices import DMI_PRODUCT_NAME, has_metadata_server
from xlarun.host.metadata import NOTICES, Notice, Notices
from xlarun.supervision.end import RunEnd

WAIT_S = 30.0


def next_notices(notices: Notices, timeout: float = WAIT_S) -> list[Notice]:
    """What the pipe brings within ``timeout`` (the event loop's own way of waiting), or []."""
    with selectors.DefaultSelector() as selector:
        selector.register(notices.fd, selectors.EVENT_READ)
        return notices.read() if selector.select(timeout) else []


def polls(served_requests: list[tuple[str, str | None]], name: str) -> int:
    return sum(f"/instance/{name}" in path for path, _ in served_requests)


def test_each_change_to_a_notice_is_handed_over_once_as_it_comes() -> None:
    with serve_metadata({}) as served:
        notices = Notices({"GCE_METADATA_HOST": served.host})
        try:
            deadline = time.monotonic() + WAIT_S
            while not all(polls(served.requests, name) >= 2 for name in ("preempted", "maintenance-event")):
                assert time.monotonic() < deadline, served.requests
                time.sleep(0.01)
            assert next_notices(notices, 0.2) == []  # FALSE and NONE announce nothing
            served.instance.change("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            assert next_notices(notices) == [NOTICES[2]]
            served.instance.change("maintenance-event", "SOMETHING_NEW")  # a value of no notice
            served.instance.change("preempted", "TRUE")
            assert next_notices(notices) == [NOTICES[0]]
            served.instance.change("preempted", "TRUE")  # a new version of the same value: nothing new
            assert next_notices(notices, 0.5) == []
        finally:
            notices.close()
    # Every request after the first of each value waited for a change, naming the version it had.
    waited = [path for path, _ in served.requests if "wait_for_change=true" in path]
    assert waited and all("last_etag=" in path and "timeout_sec=300" in path for path in waited)
    assert {flavor for _, flavor in served.requests} == {"Google"}


def test_a_server_that_fails_is_asked_again_ever_more_slowly_and_never_followed() -> None:
    with serve_metadata({}, behaviour="redirect") as served:
        notices = Notices({"GCE_METADATA_HOST": served.host})
        deadline = time.monotonic() + WAIT_S
        while not polls(served.requests, "preempted"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.5)  # a pause of 1 s, then one of 2 s: one more request at most
        notices.close()
    assert polls(served.requests, "preempted") <= 2, served.requests
    assert REDIRECT_TARGET not in [path for path, _ in served.requests]


def test_a_server_that_answers_long_polls_at_once_is_not_polled_in_a_loop() -> None:
    with serve_metadata({}, behaviour="impatient") as served:
        notices = Notices({"GCE_METADATA_HOST": served.host})
        deadline = time.monotonic() + WAIT_S
        while polls(served.requests, "preempted") < 2:  # the value, then a long poll answered at once
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.5)  # a pause of 1 s, then one of 2 s: one more request at most
        notices.close()
    assert polls(served.requests, "preempted") <= 3, served.requests


def test_a_notice_already_given_when_the_watch_starts_comes_at_once() -> None:
    with serve_metadata({}) as served:
        served.instance.change("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        notices = Notices({"GCE_METADATA_HOST": served.host})
        try:
            assert next_notices(notices) == [NOTICES[1]]
        finally:
            notices.close()


@pytest.mark.parametrize(
    "environ, product, expected",
    [
        ({"GCE_METADATA_HOST": "127.0.0.1:8080"}, None, True),
        ({}, "Google Compute Engine\n", True),
        ({}, "Standard PC (Q35 + ICH9, 2009)\n", False),
        ({}, None, False),
    ],
)
def test_a_metadata_server_is_where_its_variable_or_the_firmware_says(
    tmp_path: Path, environ: dict[str, str], product: str | None, expected: bool
) -> None:
    if product is not None:
        (tmp_path / DMI_PRODUCT_NAME).parent.mkdir(parents=True)
        (tmp_path / DMI_PRODUCT_NAME).write_text(product)
    assert has_metadata_server({**environ, "XLARUN_HOST_ROOT": str(tmp_path)}) is expected


def test_a_run_that_ends_after_a_notice_that_the_vm_stops_is_preempted_with_its_own_code() -> None:
    signalled = RunEnd.signalled(15).preempted()
    assert (signalled.result, signalled.exit_code, signalled.launcher_signal) == ("preempted", 143, 15)
    failed = RunEnd.launcher_error("the store is gone").preempted()
    assert (failed.result, failed.exit_code, failed.error) == ("preempted", 1, "the store is gone")
    assert RunEnd.succeeded().preempted().result == "succeeded"  # its work was done all the same
    assert RunEnd.not_needed().preempted().result == "not_needed"
