"""The dashboard's pages (Jinja2, autoescaped) and its forms: sign-in, and
each action's confirmation and post."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from dblockrun.errors import DatabaseError, DblockrunError, UsageError
from dblockrun.ops.output import host_name
from dblockrun.store.models import HostStatus
from dblockrun.store.status import host_name as name_of
from dblockrun.store.status import running_per_host, with_drains
from dblockrun.web import sessions
from dblockrun.web.acts import (
    ACTIONS,
    DESTRUCTIVE,
    HOST_ACTIONS,
    JOB_ACTIONS,
    ROLE_OF,
    ActionRequest,
    offered,
    perform,
)
from dblockrun.web.context import HERE, config, csrf_ok, csrf_token, current_user, refusal
from dblockrun.web.errors import public
from dblockrun.web.timehtml import duration, left, when
from dblockrun.web.users import check_password

#: The most fields a form of the dashboard has (sign-in: 4; an action: 6).
FORM_FIELDS = 16

#: Runs on a job's page (and in its chart).
HISTORY = 50

_env = Environment(loader=FileSystemLoader(HERE / "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))
_env.filters.update(ago=when, left=left, took=duration, hostname=host_name)


def render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    cfg = config(request)
    user = current_user(request)
    signed_in = cfg.users is not None and user is not None
    flash = request.session.pop("flash", None) if "session" in request.scope else None
    html = _env.get_template(template).render(
        user=user, signed_in=signed_in, read_only=cfg.users is None,
        csrf=csrf_token(request) if cfg.users is not None else "",
        can=lambda action: signed_in and user is not None and user.can(ROLE_OF[action]),
        flash=flash, destructive=DESTRUCTIVE, **{"now": time.time(), **ctx})
    return HTMLResponse(html, status_code=status)


def _sign_in_first(request: Request) -> Response | None:
    if current_user(request) is not None:
        return None
    return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)


def _status_doc(request: Request, names: list[str]) -> dict[str, Any]:
    """``status --json``'s document of some jobs (one serializer for the
    CLI, API and pages)."""
    from dblockrun.ops.output import status_json

    got = config(request).store.status(names)
    from dblockrun.jobs import EVERY_HOST_SEP

    # A row JOB@HOST is its every-host job's: JOB's definition counts too.
    wanted = set(names) | {name.split(EVERY_HOST_SEP, 1)[0] for name in names}
    hosts = [_with_jobs(h, wanted) for h in got.hosts]
    doc: dict[str, Any] = json.loads(status_json(got.jobs, hosts, got.db_now, None,
                                                 got.paused, got.groups))
    return doc


def _with_jobs(host: HostStatus, names: set[str]) -> HostStatus:
    """``host`` with only these jobs' definitions: what the shown jobs'
    drift and notes need (each live host lists every job of its file: 10,000
    jobs on 4 hosts are 40,000 entries to sort through for 100 shown)."""
    from dataclasses import replace

    listed = host.job_hashes()
    if listed is None:
        return host
    return replace(host, jobs=json.dumps({k: v for k, v in listed.items() if k in names}))


def fleet_data(request: Request) -> dict[str, Any]:
    """The Fleet page's data: the counts, one page of the jobs its query
    (web/fleetview.py: state, group, label, host, name, sort, page) matches,
    hosts, groups, pause; all from the shared status snapshot."""
    from dblockrun.web.fleetview import KINDS, SORTS, groups_of, known_groups, query_of, select

    cfg = config(request)
    status = cfg.status.get()
    query = query_of(request.query_params)
    file_groups = groups_of(cfg.jobs.jobs if cfg.jobs is not None else None)
    sel = select(status, query, file_groups)
    hosts = sorted({h["id"] for h in status.doc["hosts"]}
                   | {host_name(h["id"]) for h in status.doc["hosts"]})
    return {"doc": status.doc, "now": status.db_now, "query": query, "sel": sel,
            "kinds": KINDS, "sorts": SORTS, "hosts_known": hosts,
            "groups_known": known_groups(status, list(file_groups.values()))}


def fleet(request: Request) -> Response:
    return _sign_in_first(request) or render(request, "fleet.html", **fleet_data(request))


def fleet_live(request: Request) -> Response:
    """The live part of the Fleet page, which its script fetches every 2 s."""
    if current_user(request) is None:
        return HTMLResponse("sign in", status_code=401)
    return render(request, "fleet_live.html", **fleet_data(request))


def job(request: Request) -> Response:
    from dblockrun.ops.actions import require_job

    if (login := _sign_in_first(request)) is not None:
        return login
    store = config(request).store
    name = request.path_params["job"]
    try:
        require_job(store, name)
    except UsageError as exc:
        return render(request, "error.html", status=404, message=public(store, exc.message))
    data = _job_data(request, name)
    return render(request, "job.html", **data, **_definition(request, name, data["job"]))


def job_live(request: Request) -> Response:
    """The live part of the Job page (facts, actions, chart, history), which
    its script fetches every 2 s."""
    if current_user(request) is None:
        return HTMLResponse("sign in", status_code=401)
    from dblockrun.ops.actions import require_job

    name = request.path_params["job"]
    try:
        require_job(config(request).store, name)
    except UsageError:
        return HTMLResponse("no such job", status_code=404)
    return render(request, "job_live.html", **_job_data(request, name))


def _job_data(request: Request, name: str) -> dict[str, Any]:
    from dblockrun.ops.output import audit_entry_json
    from dblockrun.web.chart import duration_chart

    store = config(request).store
    doc = _status_doc(request, store.with_every_host([name]))
    runs = store.history(name, HISTORY, output=False)
    now = store.db_now()  # after the history: no run reads "in 0.0s"
    shown = next((j for j in doc["jobs"] if j["name"] == name), None)
    return {"name": name, "doc": doc, "job": shown, "actions": offered(shown), "runs": runs,
            "now": now, "chart": duration_chart(runs, now),
            "audit": [audit_entry_json(e) for e in store.control.entries(name, 10)]}


def _definition(request: Request, name: str, job: dict[str, Any] | None) -> dict[str, Any]:
    """The Job page's definition: this server's jobs file's (``-f``), and each
    live host's hash with, where it differs, the keys that do (``status
    --json``'s ``drift_keys``)."""
    from dblockrun.ops.definition import file_job, shown_definition

    cfg = config(request)
    jobs = cfg.jobs
    mine = file_job(jobs, name) if jobs is not None else None
    # Keyed as the daemons key theirs (the fleet's secret): comparable.
    mine_hash = mine.definition_hash(cfg.store.fleet_key()) if mine is not None else None
    job = job or {}
    hosts = []
    for digest, on in job.get("definitions", {}).items():
        if job.get("drift") and digest != mine_hash:  # the keys, where daemons wrote them
            differs = ", ".join(job.get("drift_keys", [])) or "keys not known (an older daemon)"
        elif mine_hash is not None and digest != mine_hash:
            differs = "differs from this server's jobs file"
        else:
            differs = "-"
        hosts += [{"host": host, "hash": digest, "same": digest == mine_hash,
                   "differs": differs} for host in on]
    commands = cfg.shows_commands(current_user(request))
    return {"jobs_file": jobs.path if jobs is not None else None,
            "definition": shown_definition(mine, commands) if mine is not None else None,
            "commands_hidden": not commands,
            "definition_hash": mine_hash, "host_definitions": sorted(
                hosts, key=lambda h: str(h["host"]))}


def run_page(request: Request) -> Response:
    if (login := _sign_in_first(request)) is not None:
        return login
    data = _run_data(request)
    if data is None:
        return render(request, "error.html", status=404,
                      message=f"no run {request.path_params['run_id']}")
    return render(request, "run.html", **data)


def run_live(request: Request) -> Response:
    """The live part of the Run page (its facts and output), which its
    script fetches every 2 s while the run runs (``data-final``: it ended)."""
    if current_user(request) is None:
        return HTMLResponse("sign in", status_code=401)
    data = _run_data(request)
    if data is None:
        return HTMLResponse("no such run", status_code=404)
    return render(request, "run_live.html", **data)


def _run_data(request: Request) -> dict[str, Any] | None:
    from dblockrun.ops.output import output_text

    try:
        run_id = int(request.path_params["run_id"])
    except ValueError:
        run_id = 0
    store = config(request).store
    found = store.run(run_id) if run_id > 0 else None
    if found is None:
        return None
    return {"run": found, "live": found.live, "now": store.db_now(),
            "output": output_text(found.output or "")}


def timeline(request: Request) -> Response:
    """The fleet timeline (timeline.py): ``?window=`` a duration (1h),
    ``?end=`` an ISO time (now): what ran on each host in that window."""
    from dblockrun.durations import format_duration, parse_duration
    from dblockrun.timetext import parse_time
    from dblockrun.web import timeline as tl

    if (login := _sign_in_first(request)) is not None:
        return login
    store = config(request).store
    asked = request.query_params.get("window", "").strip() or format_duration(tl.WINDOW)
    end_text = request.query_params.get("end", "").strip()
    try:
        window = parse_duration(asked)
        if not 0 < window <= tl.LONGEST:
            raise ValueError(f"at most {format_duration(tl.LONGEST)}")
    except ValueError as exc:
        return render(request, "error.html", status=400, message=f"window {asked!r}: {exc}")
    try:
        end = parse_time(end_text, "end") if end_text else None
    except UsageError as exc:
        return render(request, "error.html", status=400, message=exc.message)
    now = store.db_now()
    end = now if end is None else end
    start = end - window
    records = store.runs_between(start, end, tl.MOST + 1)
    names = tl.host_names(store.hosts())
    drawn = tl.draw(records[:tl.MOST], start, end, now,
                    [names[h.id] for h in store.live_hosts() if h.id in names], names)
    return render(request, "timeline.html", drawn=drawn, window=format_duration(window),
                  end=end_text, start=start, stop=end, now=now, choices=tl.CHOICES,
                  cut=len(records) > tl.MOST, most=tl.MOST)


def hosts(request: Request) -> Response:
    from dataclasses import replace

    from dblockrun.ops.output import host_json

    if (login := _sign_in_first(request)) is not None:
        return login
    store = config(request).store
    live = {h.id for h in store.live_hosts()}
    # A live host's runs as `status` and the Fleet page count them (its
    # daemon's published count is up to a heartbeat old); a dead one's, the
    # count it last published.
    running = running_per_host(store)
    # Each host with its drain in effect (dblockrun drain), and the name it goes by.
    known = [replace(h, running=running.get(h.id, 0)) if h.id in live else h
             for h in with_drains(store.hosts(), store.drains.current())]
    return render(request, "hosts.html",
                  hosts=[{**host_json(h), "live": h.id in live, "name": name_of(h)}
                         for h in known])


def audit(request: Request) -> Response:
    from dblockrun.ops.output import audit_entry_json

    if (login := _sign_in_first(request)) is not None:
        return login
    job_name = request.query_params.get("job") or None
    entries = config(request).store.control.entries(job_name, 200)
    return render(request, "audit.html", entries=[audit_entry_json(e) for e in entries],
                  job=job_name)


# -- actions ---------------------------------------------------------------------------


def _target(params: Any) -> tuple[str | None, int | None]:
    job_name = params.get("job") or None
    run_text = params.get("run") or None
    try:
        run_id = int(run_text) if run_text else None
    except ValueError:
        raise UsageError(f"no run {run_text}") from None
    return job_name, run_id


def confirm(request: Request) -> Response:
    """The form that asks to confirm an action (GET: changes nothing)."""
    if (login := _sign_in_first(request)) is not None:
        return login
    action = request.path_params["action"]
    if action not in ACTIONS:
        return render(request, "error.html", status=404, message=f"no action {action!r}")
    try:
        job_name, run_id = _target(request.query_params)
    except UsageError as exc:
        return render(request, "error.html", status=404, message=exc.message)
    host = request.query_params.get("host") if action in HOST_ACTIONS else None
    if action in HOST_ACTIONS and not host:
        return render(request, "error.html", status=404, message=f"{action}: which host?")
    return render(request, "confirm.html", action=action, job=job_name, run_id=run_id,
                  role=ROLE_OF[action], host=host)


async def act(request: Request) -> Response:
    """POST /act/ACTION: the action, once the form's CSRF token, the user and
    the role check; back to where it was asked, with what happened."""
    from starlette.concurrency import run_in_threadpool

    cfg = config(request)
    action = request.path_params["action"]
    form = await request.form(max_files=0, max_fields=FORM_FIELDS)
    if action not in ACTIONS:
        return render(request, "error.html", status=404, message=f"no action {action!r}")
    token = form.get("csrf")
    refused = refusal(request, ROLE_OF[action], token if isinstance(token, str) else None)
    if refused is not None and refused[0] == 401:
        return RedirectResponse("/login", status_code=303)
    if refused is not None:
        return render(request, "error.html", status=refused[0], message=refused[1])
    user = current_user(request)
    assert user is not None

    def field(name: str) -> str | None:
        value = form.get(name)
        return value if isinstance(value, str) and value.strip() else None

    try:
        job_name, run_id = _target(form)
    except UsageError as exc:
        return render(request, "error.html", status=404, message=exc.message)
    try:
        said, _doc = await run_in_threadpool(
            perform, cfg.store, user.name,
            ActionRequest(action, job_name, field("reason"), field("for"), field("until"), run_id,
                          field("host") if action in HOST_ACTIONS else None))
        cfg.status.forget()
        request.session["flash"] = {"ok": True, "text": said}
    except DatabaseError:
        raise  # 503, naming nothing (errors.py)
    except DblockrunError as exc:
        request.session["flash"] = {"ok": False, "text": public(cfg.store, exc.message)}
    back = f"/jobs/{quote(job_name, safe='')}" if job_name and action in JOB_ACTIONS else (
        f"/runs/{run_id}" if run_id else "/hosts" if action in HOST_ACTIONS else "/")
    return RedirectResponse(back, status_code=303)


# -- sign-in ---------------------------------------------------------------------------


def _next(value: Any) -> str:
    """Where to go after signing in: a path of this site only."""
    if isinstance(value, str) and value.startswith("/") and not value.startswith("//") \
            and "\\" not in value:
        return value
    return "/"


async def login(request: Request) -> Response:
    """Sign in: the form's CSRF token, then the attempt counted (signin.py)
    before the password is checked, at most two checks at once; a new
    session (sessions.py) when it is right."""
    from starlette.concurrency import run_in_threadpool

    cfg = config(request)
    if cfg.users is None:
        return render(request, "error.html", status=404,
                      message="no users are configured: the dashboard is read-only for anyone")
    if request.method == "GET":
        return render(request, "login.html", next=_next(request.query_params.get("next")))
    form = await request.form(max_files=0, max_fields=FORM_FIELDS)
    name, password = str(form.get("name") or ""), str(form.get("password") or "")
    token = form.get("csrf")
    if not csrf_ok(request, token if isinstance(token, str) else None):
        return render(request, "login.html", status=403, next="/",
                      message="the form's CSRF token is missing or wrong: try again")
    after = _next(form.get("next"))
    client = request.client.host if request.client else "-"
    window = f"{cfg.limits.sign_in_window:g} s"
    if not cfg.logins.attempt(client, name):
        return render(request, "login.html", status=429, next=after,
                      message=f"too many sign-ins: wait {window}")
    user = cfg.users.get(name)
    ok = await run_in_threadpool(cfg.checks.run, lambda: check_password(user, password))
    if ok is None:  # not checked: too many checks waiting
        cfg.logins.forget(client, name)
        return render(request, "login.html", status=429, next=after,
                      message="too many sign-ins at once: try again in a moment")
    if not ok or user is None:
        return render(request, "login.html", status=401, next=after,
                      message="wrong name or password")
    cfg.logins.forget(client, name)  # a sign-in that worked does not count
    await run_in_threadpool(sessions.start, cfg.store, request, user.name,
                            cfg.limits.session_lifetime)
    csrf_token(request)
    return RedirectResponse(after, status_code=303)


async def logout(request: Request) -> Response:
    """Sign out: the session ends everywhere (its row is deleted)."""
    from starlette.concurrency import run_in_threadpool

    form = await request.form(max_files=0, max_fields=FORM_FIELDS)
    token = form.get("csrf")
    if csrf_ok(request, token if isinstance(token, str) else None):
        await run_in_threadpool(sessions.end, config(request).store, request)
    return RedirectResponse("/login", status_code=303)


def routes() -> list[Route]:
    return [
        Route("/", fleet),
        Route("/fleet/live", fleet_live),
        Route("/jobs/{job}", job),
        Route("/jobs/{job}/live", job_live),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/live", run_live),
        Route("/timeline", timeline),
        Route("/hosts", hosts),
        Route("/audit", audit),
        Route("/confirm/{action}", confirm),
        Route("/act/{action}", act, methods=["POST"]),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
    ]
