"""A worker whose key the home revoked says so (DESIGN §1 "Multi-host", §3 CURVE; the home
link's handshake watch, runtime/node/homelink.py).

The home drops an established connection's frames once its key is revoked, so the worker
only saw its heartbeats go unanswered: `status` and `doctor` said "unreachable (no answer to a
heartbeat)" and "check the network", which sent its operator after a network fault that was
not there. The worker now opens a fresh connection after a missed beat (as it did already)
and watches its handshake: the home's refusal is reported as such, and allowing the key again
brings the worker back by itself.

Real nodes on loopback: a home and one worker, each a process with its own state dir and
keys, driven through the real CLI. Nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fleet import Fleet, fleet
from tests.support.runs import wait_until

pytestmark = pytest.mark.slow

REFUSED = "the home refused this worker's key"


@pytest.fixture
def crew() -> Iterator[Fleet]:
    with fleet(("w1",), heartbeat=(0.2, 1.5)) as started:
        yield started


def test_a_revoked_worker_says_its_key_was_refused_not_that_the_network_failed(
    crew: Fleet,
) -> None:
    w1 = crew.workers["w1"]
    code, _, err = crew.cli(crew.home, "keys", "revoke", "w1")
    assert code == 0, err

    def status_says_refused() -> str | None:
        code, out, _ = crew.cli(w1, "status")
        return out if code == 0 and REFUSED in out else None

    out = wait_until(status_says_refused, what="w1's status names the refused key")
    assert "unreachable" in out and "no answer to a heartbeat" not in out, out
    cluster = w1.status().cluster
    assert cluster is not None and cluster.state == "unreachable" and cluster.key_refused
    code, out, err = crew.cli(w1, "doctor")
    report = out + err
    assert REFUSED in report and "keys allow" in report, report
    assert "check the network" not in report, report
    # The key allowed again: the worker heartbeats again by itself, and says so.
    code, _, err = crew.cli(
        crew.home, "keys", "allow", "--name", "w1", "--", crew.public_key(w1.state_dir)
    )
    assert code == 0, err
    wait_until(
        lambda: (c := w1.status().cluster) is not None and c.state == "joined",
        what="w1 joined again",
    )
    cluster = w1.status().cluster
    assert cluster is not None and not cluster.key_refused and not cluster.reason
