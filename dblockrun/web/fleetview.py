"""The Fleet page as a console: each job's facts to filter, count and sort
by, worked out once per status document (in the snapshot's read,
web/snapshot.py), and the page's query (its URL) over them.

A request filters, counts and sorts these rows in Python: no statement of
its own, whatever the number of jobs (10,000: a few milliseconds).

The counts (:data:`KINDS`): ``running``; ``failed`` (the last run failed,
timed out or was lost: what ``status --check`` reports); ``late`` (no start
for more than twice its period, as ``status --check`` says, or its newest
record a passed slot, ``missed`` or ``skipped``); ``disabled``; ``paused``
(the fleet is paused: every job not disabled); ``drifting`` (live hosts
define it differently); ``waiting`` (a slot queued for its group's seat).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from dblockrun.jobs import EVERY_HOST_SEP
from dblockrun.ops.check import BAD_RESULTS, overdue
from dblockrun.ops.output import host_name
from dblockrun.store.models import PASSED, JobStatus

if TYPE_CHECKING:
    from dblockrun.store.roles import StatusReading

#: The counts atop the Fleet page, each a filter (``?state=``), and their words.
KINDS = {"running": "running", "failed": "failed last run", "late": "late or missed",
         "disabled": "disabled", "paused": "paused", "drifting": "drifting",
         "waiting": "waiting"}
#: The kinds ``?problems=first`` puts first.
PROBLEMS = frozenset({"failed", "late"})
#: What the page sorts by (``?sort=``), and their words.
SORTS = {"name": "name", "result": "last result", "started": "last start",
         "next": "next run", "duration": "duration"}
#: Jobs on one page.
PAGE = 100


@dataclass(frozen=True, slots=True)
class Row:
    """One job: its entry of the status document, and what the page asks of it."""

    name: str
    #: Its entry of ``status --json``'s ``jobs`` (what the page shows).
    job: dict[str, Any]
    kinds: frozenset[str]
    #: Its last run's result, start and duration (None: no run yet; no
    #: duration for a passed slot: it did not run).
    result: str | None
    started: float | None
    duration: float | None
    #: The next run's time (None: none, or a note instead).
    next_due: float | None
    #: The hosts it runs or last ran on: their ids and host names.
    hosts: frozenset[str]
    #: Its run-on's labels: ``key`` and ``key=value``.
    labels: frozenset[str]
    #: The group whose seat it holds now, if any.
    seat_group: str | None


@dataclass(frozen=True)
class FleetStatus:
    """The whole fleet, read at one database time: ``status --json``'s text
    (``GET /api/v1/status``), its document, and a row per job by name."""

    text: str
    doc: dict[str, Any]
    rows: list[Row]
    db_now: float


def read(store: StatusReading) -> FleetStatus:
    """Every job's status (dblockrun/store/status.py, one report), written as
    ``status --json`` writes it (ops/output.py), and each job's row."""
    import gc

    from dblockrun.ops.output import dumps, status_doc

    got = store.status()
    enabled = gc.isenabled()
    gc.disable()  # a million short-lived objects, no cycles (ops/output.py _uncollected)
    try:
        doc = status_doc(got.jobs, got.hosts, got.db_now, None, got.paused, got.groups)
        text = dumps(doc)
        seats = {job: g.group for g in got.groups for job, _host in g.held}
        rows = _rows(got.jobs, doc["jobs"], got.paused is not None, seats)
    finally:
        if enabled:
            gc.enable()
    rows.sort(key=lambda r: r.name)
    return FleetStatus(text, doc, rows, got.db_now)


def _rows(jobs: Sequence[JobStatus], docs: Sequence[dict[str, Any]], paused: bool,
          seats: Mapping[str, str]) -> list[Row]:
    """A row per job (``docs``: their entries of the status document)."""
    names: dict[str, frozenset[str]] = {}  # a few hosts, 10,000 jobs

    def on(host: str) -> frozenset[str]:
        found = names.get(host)
        if found is None:
            found = names[host] = frozenset((host, host_name(host)))
        return found

    out = []
    for s, job in zip(jobs, docs, strict=True):
        name = s.lock.name
        last = s.last_run
        state = s.state
        kinds = {state} & _STATE_KINDS
        if last is not None and last.result in BAD_RESULTS:
            kinds.add("failed")
        if (last is not None and last.result in PASSED) or (not paused and overdue(s)):
            kinds.add("late")
        if paused and state != "disabled":
            kinds.add("paused")
        if job["drift"]:
            kinds.add("drifting")
        hosts: frozenset[str] = _NONE
        for run in (last, s.running, *s.lane_runs):
            if run is not None:
                hosts = hosts | on(run.host)
        if job["holder"]:
            hosts = hosts | on(job["holder"])
        if EVERY_HOST_SEP in name:
            hosts = hosts | {name.split(EVERY_HOST_SEP, 1)[1]}
        run_on = job["run_on"]
        labels = frozenset(x for key, values in run_on.items()
                           for x in (key, *(f"{key}={v}" for v in values))) if run_on else _NONE
        out.append(Row(
            name=name, job=job, kinds=frozenset(kinds),
            result=None if last is None else last.result,
            started=None if last is None else last.started,
            duration=None if last is None or last.result in PASSED else last.duration,
            next_due=s.lock.next_due if job["next_run"] is not None else None,
            hosts=hosts, labels=labels, seat_group=seats.get(name)))
    return out


_NONE: frozenset[str] = frozenset()
#: The job states that are kinds of their own.
_STATE_KINDS = frozenset({"running", "waiting", "disabled"})


# -- the page's query ------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """What the Fleet page's URL asks for; every part combines with the others."""

    #: Kinds of :data:`KINDS` (any of them).
    states: tuple[str, ...] = ()
    group: str = ""
    #: ``key`` or ``key=value`` of a job's run-on.
    label: str = ""
    #: A host's id or host name that runs or last ran the job.
    host: str = ""
    #: A part of the name (any case).
    q: str = ""
    sort: str = "name"
    desc: bool = False
    #: The failed and the late first (each part in the order asked).
    problems_first: bool = False
    page: int = 1

    def url(self, path: str = "/", **changes: Any) -> str:
        """``path`` with this query (``changes`` applied) as its query string;
        a change of anything but the page goes back to page 1."""
        if "page" not in changes:
            changes["page"] = 1
        q = replace(self, **changes)
        pairs: list[tuple[str, str]] = [("state", s) for s in q.states]
        pairs += [(k, v) for k, v in (("group", q.group), ("label", q.label),
                                      ("host", q.host), ("q", q.q)) if v]
        if q.sort != "name":
            pairs.append(("sort", q.sort))
        if q.desc:
            pairs.append(("desc", "1"))
        if q.problems_first:
            pairs.append(("problems", "first"))
        if q.page > 1:
            pairs.append(("page", str(q.page)))
        return f"{path}?{urlencode(pairs)}" if pairs else path


def query_of(params: Any) -> Query:
    """The query of a request's parameters (a Starlette QueryParams); what
    it does not know is left out, never an error."""
    states = tuple(dict.fromkeys(s for s in params.getlist("state") if s in KINDS))
    sort = params.get("sort", "name")
    try:
        page = max(1, int(params.get("page", "1")))
    except ValueError:
        page = 1
    return Query(states=states, group=params.get("group", "").strip(),
                 label=params.get("label", "").strip(), host=params.get("host", "").strip(),
                 q=params.get("q", "").strip(), sort=sort if sort in SORTS else "name",
                 desc=params.get("desc", "") not in ("", "0"),
                 problems_first=params.get("problems", "") == "first", page=page)


@dataclass(frozen=True)
class Selection:
    """One page of the jobs a query matches, and the counts."""

    rows: list[Row]
    total: int
    page: int
    pages: int
    #: Per kind, the jobs of it among those the other filters match.
    counts: dict[str, int]


def select(status: FleetStatus, query: Query,
           groups_of: Mapping[str, str] | None = None) -> Selection:
    """The jobs ``query`` matches, counted, sorted and cut to its page.
    ``groups_of``: job name -> group, from this server's jobs file (a job
    holding a seat is of that seat's group whatever the file says)."""
    keep = _filter(query, groups_of or {})
    rows = [r for r in status.rows if keep(r)]
    counts = dict.fromkeys(KINDS, 0)
    for r in rows:
        for kind in r.kinds:
            counts[kind] += 1
    if query.states:
        wanted = frozenset(query.states)
        rows = [r for r in rows if r.kinds & wanted]
    rows = _sorted(rows, query)
    pages = max(1, -(-len(rows) // PAGE))
    page = min(query.page, pages)
    return Selection(rows[(page - 1) * PAGE:page * PAGE], len(rows), page, pages, counts)


def _filter(query: Query, groups_of: Mapping[str, str]) -> Callable[[Row], bool]:
    """Whether a row passes the filters other than the state's."""
    needle = query.q.lower()
    tests: list[Callable[[Row], bool]] = []
    if needle:
        tests.append(lambda r: needle in r.name.lower())
    if query.group:
        group = query.group
        tests.append(lambda r: r.seat_group == group or groups_of.get(
            r.name.split(EVERY_HOST_SEP, 1)[0]) == group)
    if query.label:
        label = query.label
        tests.append(lambda r: label in r.labels)
    if query.host:
        host = query.host
        tests.append(lambda r: host in r.hosts)
    return lambda r: all(t(r) for t in tests)


#: The last results in the order ``?sort=result`` gives them: the bad first.
_RESULT_RANK = {result: i for i, result in enumerate(
    ("failed", "timeout", "lost", "killed", "missed", "skipped", "running", "waiting", "ok"))}


def _sorted(rows: list[Row], query: Query) -> list[Row]:
    """``rows`` by ``query.sort`` (then by name); jobs without the value
    last either way; the problems first when asked."""
    value: Callable[[Row], Any] = {
        "name": lambda r: r.name,
        "result": lambda r: None if r.result is None else _RESULT_RANK.get(r.result, 50),
        "started": lambda r: r.started,
        "next": lambda r: r.next_due,
        "duration": lambda r: r.duration,
    }[query.sort]
    known = [r for r in rows if value(r) is not None]
    unknown = [r for r in rows if value(r) is None]  # already by name
    known.sort(key=value, reverse=query.desc)  # stable: by name within a value
    out = known + unknown
    if query.problems_first:
        out.sort(key=lambda r: not (r.kinds & PROBLEMS))
    return out


def groups_of(jobs: Iterable[Any] | None) -> dict[str, str]:
    """Job name -> group of this server's jobs file's jobs (``group:``)."""
    return {j.name: j.group for j in jobs or () if j.group}


def known_groups(status: FleetStatus, file_groups: Sequence[str]) -> list[str]:
    """The groups to choose from: the seats' and the file's."""
    return sorted({g["name"] for g in status.doc["groups"]} | set(file_groups))
