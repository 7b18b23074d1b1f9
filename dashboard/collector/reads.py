"""The collector's queries: every read of a run's stored events, as plain rows and dicts.

Kept apart from `store.py` (receipt and ingest: how events get in, retention) so each reads
as one concern; `Store` inherits these and supplies `query` and `tuples` (a reader
connection per thread). Every per-run read goes through an index.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from dashboard.collector.records import Closed
from dashboard.collector.schema import ROLLUP_S
from loader.wire import CACHE, CHECKPOINT_SAVED, CLOSED, MIXTURE, MIXTURE_PROGRESS

RUN_COLUMNS = """r.*, (SELECT count(*) FROM ranks k WHERE k.run_id = r.run_id
  AND k.world_size = r.world_size) AS ranks"""


class Reads:
    """Queries of the stored events; the subclass (`Store`) owns the connections."""

    def query(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        raise NotImplementedError

    def tuples(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def count(self) -> int:
        """Events stored: every progress sample plus every discrete event."""
        row = self.query("SELECT (SELECT count(*) FROM samples) + (SELECT count(*) FROM events)")
        return int(row[0][0])

    def runs(self) -> list[dict[str, Any]]:
        rows = self.query(f"SELECT {RUN_COLUMNS} FROM runs r ORDER BY last_ts DESC")
        return [dict(row) for row in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run by its primary key: the cost does not grow with the number of runs."""
        rows = self.query(f"SELECT {RUN_COLUMNS} FROM runs r WHERE run_id = ?", run_id)
        return dict(rows[0]) if rows else None

    def ranks(self, run_id: str, world_size: int) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT * FROM ranks WHERE run_id = ? AND world_size = ? ORDER BY rank",
            run_id,
            world_size,
        )
        out = []
        for row in rows:
            rank = dict(row)
            for key in ("run_id", "lo", "hi"):
                del rank[key]
            rank["splits"] = [row["lo"], row["hi"]] if row["lo"] is not None else []
            rank["cursors"] = orjson.loads(row["cursors"]) if row["cursors"] else None
            out.append(rank)
        return out

    def series(self, run_id: str, since: float, bucket_s: int) -> list[tuple[Any, ...]]:
        """Per rank and time bucket: (rank, t, rows, batches, wait_s, interval_s), summed.

        Buckets of at least `ROLLUP_S` read the rollup (10× fewer rows); finer ones the
        samples, which a live view only asks for over the last minutes.
        """
        sums = "sum(rows) AS rows, sum(batches) AS batches, sum(wait_s) AS wait_s, "
        sums += "sum(interval_s) AS interval_s"
        if bucket_s == ROLLUP_S:  # rollup rows as they are: no GROUP BY to pay for
            return self.tuples(
                "SELECT rank, bucket * ? AS t, rows, batches, wait_s, interval_s FROM rollup "
                "WHERE run_id = ? AND bucket >= ?",
                ROLLUP_S,
                run_id,
                int(since // ROLLUP_S),
            )
        if bucket_s >= ROLLUP_S:
            k = bucket_s // ROLLUP_S
            return self.tuples(
                f"SELECT rank, (bucket / ?) * ? AS t, {sums} FROM rollup "
                "WHERE run_id = ? AND bucket >= ? GROUP BY t, rank ORDER BY t, rank",
                k,
                k * ROLLUP_S,
                run_id,
                int(since // ROLLUP_S),
            )
        return self.tuples(
            f"SELECT rank, CAST(ts / ? AS INTEGER) * ? AS t, {sums} FROM samples "
            "WHERE run_id = ? AND ts >= ? GROUP BY t, rank ORDER BY t, rank",
            bucket_s,
            bucket_s,
            run_id,
            since,
        )

    def events(self, run_id: str, kind: str | None, limit: int) -> list[dict[str, Any]]:
        sql = "SELECT kind, ts, rank, world_size, epoch, step, global_step, data FROM events "
        sql += "WHERE run_id = ?"
        args: list[Any] = [run_id]
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        rows = self.query(sql + " ORDER BY ts DESC LIMIT ?", *args, limit)
        return [{**dict(row), "data": orjson.loads(row["data"])} for row in reversed(rows)]

    def latest_mixture(self, run_id: str) -> dict[str, Any] | None:
        """A mixture run's latest facts: its last `mixture` or live `mixture_progress` event
        (by global step, then time) whose data names the datasets; None for other runs."""
        found = [e for kind in (MIXTURE, MIXTURE_PROGRESS) for e in self.events(run_id, kind, 1)]
        found = [e for e in found if isinstance(e["data"], dict) and e["data"].get("names")]
        return max(found, key=lambda e: (e["global_step"] or 0, e["ts"]), default=None)

    def closed_ranks(self, run_id: str, world_size: int, since: float) -> dict[int, Closed]:
        """Process (global rank) → its latest `closed` event (sent by `close()`, at exit and on
        SIGTERM) received at or after `since` (collector's clock; events stored before
        receipts were kept: sent then), read through the `events_closed` index."""
        rows = self.query(
            "SELECT rank, coalesce(process, rank) AS process, ts, data, "
            "max(coalesce(recv_ts, ts)) AS recv FROM events "
            "WHERE run_id = ? AND kind = ? AND world_size = ? "
            "AND (recv_ts >= ? OR recv_ts IS NULL AND ts >= ?) GROUP BY 2",
            run_id,
            CLOSED,
            world_size,
            since,
            since,
        )
        return {
            int(r["process"]): Closed.of(r["ts"], r["data"], r["rank"], r["recv"]) for r in rows
        }

    def closed_between(self, run_id: str, since: float, until: float) -> list[Closed]:
        """The `closed` events of any world in [since, until): who closed before a resume."""
        rows = self.query(
            "SELECT rank, ts, data FROM events WHERE run_id = ? AND ts >= ? AND ts < ? "
            "AND kind = ?",
            run_id,
            since,
            until,
            CLOSED,
        )
        return [Closed.of(row["ts"], row["data"], row["rank"]) for row in rows]

    def last_active(self, run_id: str, until: float) -> sqlite3.Row | None:
        """The latest sample before `until` in which a rank handed out batches (the index
        on (run_id, ts) read backwards: it stops at the first match)."""
        rows = self.query(
            "SELECT ts, rank FROM samples WHERE run_id = ? AND ts < ? AND batches > 0 "
            "ORDER BY ts DESC LIMIT 1",
            run_id,
            until,
        )
        return rows[0] if rows else None

    def rank_totals(self, run_id: str, since: float, world_size: int) -> list[sqlite3.Row]:
        """Per rank of the world: rows, tokens (packed data, else NULL), wait and covered
        seconds summed over the rollup buckets from the one holding `since` (10x fewer rows
        than the samples)."""
        return self.query(
            "SELECT rank, sum(rows) AS rows, sum(tokens) AS tokens, sum(wait_s) AS wait_s, "
            "sum(interval_s) AS iv "
            "FROM rollup WHERE run_id = ? AND bucket >= ? AND rank < ? GROUP BY rank "
            "ORDER BY rank",
            run_id,
            int(since // ROLLUP_S),
            world_size,
        )

    def heartbeats(self, run_id: str, world_size: int) -> list[dict[str, Any]]:
        """Each process's last report: its data-parallel rank, global rank (`process`) and
        mesh coordinates, when, its send intervals and position (no cursors)."""
        rows = self.query(
            "SELECT * FROM processes WHERE run_id = ? AND world_size = ? ORDER BY process",
            run_id,
            world_size,
        )
        out = []
        for row in rows:
            p = dict(row)
            p["mesh"] = orjson.loads(row["mesh"]) if row["mesh"] else None
            out.append(p)
        return out

    def epoch_read(self, run_id: str, world_size: int, num_splits: int) -> tuple[int, float]:
        """(the epoch the world's ranks stand in, the share of it read: every split's largest
        reported cursor over what a cursor counts up to), from the ranks' last positions."""
        rows = self.query(
            "SELECT epoch, lo, hi, cursors, blocks_per_split, rows_per_split FROM ranks k "
            "JOIN runs r USING (run_id) WHERE run_id = ? AND k.world_size = ?",
            run_id,
            world_size,
        )
        if not rows:
            return 0, 0.0
        epoch = max(row["epoch"] or 0 for row in rows)
        cursors = [0] * num_splits
        per_split = 0
        for row in rows:
            if (row["epoch"] or 0) != epoch or not row["cursors"] or row["lo"] is None:
                continue
            per_split = max(per_split, row["blocks_per_split"] or row["rows_per_split"] or 0)
            for split, c in zip(
                range(row["lo"], row["hi"]), orjson.loads(row["cursors"]), strict=False
            ):
                cursors[split] = max(cursors[split], c)
        return epoch, (sum(cursors) / (num_splits * per_split) if per_split else 0.0)

    def checkpoints_saved(self, run_id: str) -> int:
        """Checkpoints saved in the run, folded across ranks (one per step and world size)."""
        rows = self.query(
            "SELECT count(*) FROM (SELECT DISTINCT coalesce(global_step, step), world_size "
            "FROM events WHERE run_id = ? AND kind = ?)",
            run_id,
            CHECKPOINT_SAVED,
        )
        return int(rows[0][0])

    def milestones(self, run_id: str, limit: int = 10_000) -> list[dict[str, Any]]:
        """Discrete events but `closed` and live mixture and node-cache reports, folded across ranks: one row per kind, epoch, step
        (global when sent) and world size, with the data of its first event and the count
        of ranks that sent it (SQLite takes the bare `data` from the `min(ts)` row)."""
        rows = self.query(
            "SELECT kind, min(ts) AS ts, epoch, coalesce(global_step, step) AS step, world_size, "
            "data, count(DISTINCT rank) AS ranks FROM events WHERE run_id = ? AND kind != ? "
            "AND kind != ? AND kind != ? GROUP BY kind, epoch, 4, world_size ORDER BY ts LIMIT ?",
            run_id,
            CLOSED,
            MIXTURE_PROGRESS,
            CACHE,
            limit,
        )
        return [{**dict(row), "data": orjson.loads(row["data"])} for row in rows]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's attempts (a launcher's job or restart: a crash and its resume are two), in
        the order they began (by receipt): when each reported first and last, its world
        size, processes, and how many closed by each reason (`silent`: no `closed`, killed
        or crashed unless the attempt is still going)."""
        rows = self.query(
            "SELECT attempt, min(first_ts) AS first_ts, max(last_ts) AS last_ts, "
            "max(world_size) AS world_size, count(*) AS processes, min(first_recv) AS f, "
            "json_group_array(coalesce(reason, 'silent')) AS reasons "
            "FROM attempts WHERE run_id = ? GROUP BY attempt ORDER BY f, attempt",
            run_id,
        )
        out = []
        for row in rows:
            ended: dict[str, int] = {}
            for reason in orjson.loads(row["reasons"]):
                ended[reason] = ended.get(reason, 0) + 1
            attempt = {k: row[k] for k in ("attempt", "first_ts", "last_ts", "world_size")}
            out.append({**attempt, "processes": row["processes"], "ended": ended})
        return out

    def reporting_buckets(self, run_id: str) -> list[int]:
        """Rollup buckets (`ROLLUP_S` s) in which any rank reported: the gaps are outages."""
        rows = self.query("SELECT DISTINCT bucket FROM rollup WHERE run_id = ?", run_id)
        return sorted(int(row[0]) for row in rows)

    def latest_caches(self, run_id: str) -> list[dict[str, Any]]:
        """Per node cache (host, folder): its latest `cache` report's data, with `recv`, when
        the collector received it (any rank of a node may send them; the totals are the
        node's). Retention keeps a run's latest `keep_live_reports`: this reads no more."""
        rows = self.query(
            "SELECT data, coalesce(recv_ts, ts) AS recv FROM events WHERE run_id = ? "
            "AND kind = ? ORDER BY ts, id",
            run_id,
            CACHE,
        )
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:  # oldest first: the last one stays
            data = orjson.loads(row["data"])
            if isinstance(data, dict):
                key = (str(data.get("host", "")), str(data.get("cache_dir", "")))
                latest[key] = {**data, "recv": float(row["recv"])}
        return [latest[key] for key in sorted(latest)]
