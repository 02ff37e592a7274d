"""The "supervisor" table family's schema: its migrations, in order (runs, their children and
events, chain appends, lineage, the outbox, and the indexes every view and listing uses).

Owns the DDL only; the SQL that reads and writes these tables is runs/runstore.py's (and
runs/outbox.py's for `run_outbox`). A migration once released is never edited: a change is a
new entry at the end.
"""

MIGRATIONS = (
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        mode TEXT NOT NULL,
        background INTEGER NOT NULL,
        state TEXT NOT NULL,
        label TEXT NOT NULL,
        depth INTEGER NOT NULL,
        parent_run_id TEXT,
        root_run_id TEXT NOT NULL,
        run_dir TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        deadline_at REAL,
        error TEXT NOT NULL DEFAULT '',
        output TEXT NOT NULL DEFAULT '',
        runner_id TEXT NOT NULL,
        fanout TEXT NOT NULL DEFAULT '',
        capacity TEXT,
        snapshots TEXT NOT NULL
    );
    CREATE INDEX runs_by_session ON runs(session_id, created_at);
    CREATE INDEX runs_by_state ON runs(state);
    CREATE TABLE run_children (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        idx INTEGER NOT NULL,
        child_id TEXT NOT NULL,
        step INTEGER NOT NULL,
        label TEXT NOT NULL,
        agent TEXT NOT NULL,
        state TEXT NOT NULL,
        pid INTEGER,
        exit_code INTEGER,
        signal INTEGER,
        started_at REAL,
        ended_at REAL,
        error TEXT NOT NULL DEFAULT '',
        output TEXT NOT NULL DEFAULT '',
        stdout_path TEXT NOT NULL DEFAULT '',
        stderr_path TEXT NOT NULL DEFAULT '',
        proof_state TEXT,
        PRIMARY KEY (run_id, idx)
    );
    CREATE UNIQUE INDEX run_children_by_id ON run_children(child_id);
    CREATE TABLE run_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX run_events_by_run ON run_events(run_id, seq)
    """,
    # 2: resume, workflows, intercom and chain appends.
    """
    ALTER TABLE runs ADD COLUMN source_run_id TEXT;
    ALTER TABLE runs ADD COLUMN workflow_key TEXT;
    ALTER TABLE runs ADD COLUMN workflow_token TEXT;
    ALTER TABLE runs ADD COLUMN intercom TEXT NOT NULL DEFAULT 'on';
    CREATE INDEX runs_by_parent ON runs(parent_run_id);
    CREATE TABLE run_appends (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        seq INTEGER NOT NULL,
        created_at REAL NOT NULL,
        steps INTEGER NOT NULL,
        reservation_id TEXT NOT NULL,
        state TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    )
    """,
    # 3: how a run came from its source (resume, rerun, attach) and the rerun superseding it.
    """
    ALTER TABLE runs ADD COLUMN source_kind TEXT;
    ALTER TABLE runs ADD COLUMN superseded_by TEXT
    """,
    # 4: the requests owed to other owners until they answer (actors/runs/outbox.py). seq is
    # AUTOINCREMENT so it is never reused: it is the order, and an answer names its row by it.
    # No reference to `runs`: pruning a run must never drop what it still owes a ledger.
    """
    CREATE TABLE run_outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        target TEXT NOT NULL,
        run_id TEXT NOT NULL,
        type TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX run_outbox_by_target ON run_outbox(target, seq)
    """,
    # 5: what every view and listing asks, by index, not by a scan of the whole run
    # history (a view looks up the run that resumed it; `runs` lists the newest first).
    """
    CREATE INDEX runs_by_source ON runs(source_run_id, created_at);
    CREATE INDEX runs_by_created ON runs(created_at);
    CREATE INDEX runs_by_root ON runs(root_run_id, created_at)
    """,
    # 6: the steps an append record carries, so a node that dies before they join their run
    # does not lose them (actors/runs/appendrecovery.py).
    """
    ALTER TABLE run_appends ADD COLUMN body TEXT
    """,
    # 7: listings page on by (created_at, run_id), newest first (a resumed workflow reads every
    # child of its source a page at a time): each index a listing walks ends in run_id, so
    # runs created at the same instant are in index order too and no page is sorted.
    """
    DROP INDEX runs_by_parent;
    CREATE INDEX runs_by_parent ON runs(parent_run_id, created_at, run_id);
    DROP INDEX runs_by_created;
    CREATE INDEX runs_by_created ON runs(created_at, run_id);
    DROP INDEX runs_by_root;
    CREATE INDEX runs_by_root ON runs(root_run_id, created_at, run_id);
    DROP INDEX runs_by_session;
    CREATE INDEX runs_by_session ON runs(session_id, created_at, run_id)
    """,
    # 8: a workflow child's launch by key (actors/runs/workflowkeys.py): the digest of the
    # request that launched it, so the same request sent again after a lost node is that run
    # (R-WF-4), found by its key without a walk over the workflow's other children.
    """
    ALTER TABLE runs ADD COLUMN launch_digest TEXT;
    CREATE INDEX runs_by_workflow_key ON runs(parent_run_id, workflow_key, created_at)
        WHERE workflow_key IS NOT NULL
    """,
    # 9: the foreground command a run belongs to (pid and start time), so that a node which
    # adopts the run after a lost node binds it to that command when it is the node's own
    # process (actors/runs/binding.py, actors/runs/rebinding.py).
    """
    ALTER TABLE runs ADD COLUMN foreground_pid INTEGER;
    ALTER TABLE runs ADD COLUMN foreground_start REAL
    """,
    # 10: what retention and a session's active listing ask, by index, not by a walk over the
    # finished runs (tens of thousands are kept): the oldest ends first (retention's timer and
    # each prune pass, actors/runs/retention.py), and a session's runs that may still be going
    # (`capacity` and `runs --session --active` read them page by page). The partial index is
    # used by a query whose WHERE has the very same state term.
    """
    CREATE INDEX runs_by_end ON runs(ended_at) WHERE ended_at IS NOT NULL;
    CREATE INDEX runs_active_by_session ON runs(session_id, created_at, run_id)
        WHERE state IN ('queued', 'running', 'paused')
    """,
    # 11: an append's client id (`runs.append` `append_id`) and the digest of the request, so
    # the same append sent again after a lost answer is the append made, queued once.
    """
    ALTER TABLE run_appends ADD COLUMN append_id TEXT;
    ALTER TABLE run_appends ADD COLUMN digest TEXT;
    CREATE UNIQUE INDEX run_appends_by_id ON run_appends(run_id, append_id)
        WHERE append_id IS NOT NULL
    """,
    # 12: a checkpoint approval's client id (`runs.approve` `approve_id`) and the digest of the
    # request, written with the decision, so the same approve sent again after a lost answer
    # is answered with the run that went on (actors/runs/approvals.py).
    """
    CREATE TABLE run_approvals (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        approve_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        step INTEGER NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (run_id, approve_id)
    )
    """,
)
