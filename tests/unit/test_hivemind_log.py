"""``route_hivemind_logs``: hivemind's records reach the root logger at the level chosen, and
``$GWTF_P2PD_LOG_LEVEL`` opens the logger that relays p2pd's own lines on its own."""

from __future__ import annotations

import logging

import pytest

from gwtfp2p.dht.hivemind_log import P2PD_LEVEL_ENV, P2PD_LOGGER, p2pd_level, route_hivemind_logs


@pytest.fixture(autouse=True)
def restore_levels() -> None:
    saved = {name: logging.getLogger(name).level for name in ("hivemind", P2PD_LOGGER)}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def test_p2pd_lines_take_hiveminds_level_unless_the_variable_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(P2PD_LEVEL_ENV, raising=False)
    route_hivemind_logs("CRITICAL")
    assert not logging.getLogger(P2PD_LOGGER).isEnabledFor(logging.ERROR)

    monkeypatch.setenv(P2PD_LEVEL_ENV, "debug")
    route_hivemind_logs("CRITICAL")
    assert logging.getLogger(P2PD_LOGGER).isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("hivemind.dht").isEnabledFor(logging.ERROR)  # the rest of hivemind stays quiet


def test_a_level_that_is_not_one_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(P2PD_LEVEL_ENV, "loud")
    with pytest.raises(ValueError, match=f"{P2PD_LEVEL_ENV}='LOUD'.*DEBUG, INFO"):
        p2pd_level()
