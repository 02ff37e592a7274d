"""`doctor` on a worker's state dir (DESIGN §1 "Multi-host": its ledgers are its home's).

It warned "store capacity: .../capacity.db does not exist yet; fix: start the node once" (and
the same for fanout and session) on every worker, running or not: those databases live on
the home and are never in a worker's dir, and the node there had started. It now says they
are kept on the home; the worker's own store (`runs.db`) is checked as before.

Real nodes on loopback, through the real CLI. Nothing is mocked.
"""

from __future__ import annotations

import pytest

from tests.support.fleet import fleet
from tests.support.nodes import run_cli

pytestmark = pytest.mark.slow


def test_doctor_on_a_worker_says_its_ledgers_are_on_the_home_not_that_they_are_missing() -> None:
    with fleet(("w1",)) as crew:
        w1 = crew.workers["w1"]
        said = run_cli("doctor", state_dir=w1.state_dir)
        report = said.stdout + said.stderr
        assert "does not exist yet" not in report, report
        for store in ("capacity", "fanout", "session"):
            assert f"[ok  ] store {store}: kept on the home" in report, report
        assert "[ok  ] store runs integrity" in report, report
        # The home's own dir has every ledger's database, checked as before.
        said = run_cli("doctor", state_dir=crew.home.state_dir)
        assert "[ok  ] store capacity integrity" in said.stdout + said.stderr
