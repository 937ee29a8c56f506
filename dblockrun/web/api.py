"""``/api/v1``: JSON over the fleet, the shapes of ``status --json``,
``history --json`` and ``audit --json`` (``dblockrun/ops/output.py``).

Reads need a viewer (anyone when no users are configured); writes an
operator or admin (``acts.ROLE_OF``), signed in by an API token
(``Authorization: Bearer``) or by the session with its CSRF token in the
``X-CSRF-Token`` header. No endpoint takes a command or a job definition.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dblockrun.errors import DatabaseError, DblockrunError, UsageError
from dblockrun.store.models import RunRecord
from dblockrun.web.acts import ROLE_OF, ActionRequest, perform
from dblockrun.web.context import config, current_user, refusal
from dblockrun.web.errors import public
from dblockrun.web.openapi import OPENAPI

#: The most runs or audit entries one request reads.
MAX_LIMIT = 1000


def _json(text: str, status: int = 200) -> Response:
    return Response(text, status_code=status, media_type="application/json")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _denied(request: Request) -> JSONResponse | None:
    """401 when someone must sign in first, else None."""
    if current_user(request) is None:
        return error(401, "sign in: an API token (Authorization: Bearer) or a session")
    return None


def _limit(request: Request, default: int = 20) -> int:
    text = request.query_params.get("limit", str(default))
    try:
        limit = int(text)
    except ValueError:
        raise UsageError(f"limit: {text!r} is not a number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"limit: between 1 and {MAX_LIMIT}")
    return limit


def status(request: Request) -> Response:
    from dblockrun.ops.actions import no_such_job
    from dblockrun.ops.output import status_json

    if (denied := _denied(request)) is not None:
        return denied
    cfg = config(request)
    store = cfg.store
    names = request.query_params.getlist("job")
    if not names:
        return _json(cfg.status.get().text)
    got = store.status(store.with_every_host(names))
    missing = sorted(set(names) - {r.lock.name for r in got.jobs})
    if missing:
        return error(404, public(store, no_such_job(store, missing).message))
    return _json(status_json(got.jobs, got.hosts, got.db_now, None, got.paused, got.groups))


def _job_and_limit(request: Request) -> tuple[str | None, int] | Response:
    """A listing's ``?job=`` (a job the database knows) and ``?limit=``, or
    the response that refuses the request."""
    from dblockrun.ops.actions import require_job

    if (denied := _denied(request)) is not None:
        return denied
    job = request.query_params.get("job")
    store = config(request).store
    try:
        limit = _limit(request)
        if job is not None:
            require_job(store, job)
    except UsageError as exc:
        return error(400, public(store, exc.message))
    return job, limit


def history(request: Request) -> Response:
    from dblockrun.ops.output import history_json

    asked = _job_and_limit(request)
    if isinstance(asked, Response):
        return asked
    job, limit = asked
    runs = config(request).store.history(job, limit, item=request.query_params.get("item"),
                                          output=False)
    return _json(history_json(runs))


def _run_id(request: Request) -> int | None:
    try:
        return int(request.path_params["run_id"])
    except ValueError:
        return None


def _found_run(request: Request) -> RunRecord | Response:
    """The run the path names, or the response that refuses the request."""
    if (denied := _denied(request)) is not None:
        return denied
    run_id = _run_id(request)
    found = None if run_id is None else config(request).store.run(run_id)
    if found is None:
        return error(404, f"no run {request.path_params['run_id']}")
    return found


def run(request: Request) -> Response:
    from dblockrun.ops.output import JSON_VERSION, dumps, run_json

    found = _found_run(request)
    if isinstance(found, Response):
        return found
    return _json(dumps({"version": JSON_VERSION, "run": run_json(found)}))


def output(request: Request) -> Response:
    """A run's stored output (the newest 64 KiB), as ``history --output``
    prints it: control characters escaped, passwords in URLs hidden. While
    the run is running it is the live tail its holder wrote at its last
    heartbeat, said by ``live`` (``RunRecord.live``)."""
    from dblockrun.ops.output import JSON_VERSION, dumps, output_text, run_json

    found = _found_run(request)
    if isinstance(found, Response):
        return found
    return _json(dumps({"version": JSON_VERSION, "run": run_json(found),
                        "output": output_text(found.output or ""), "live": found.live}))


def audit(request: Request) -> Response:
    from dblockrun.ops.output import audit_json

    asked = _job_and_limit(request)
    if isinstance(asked, Response):
        return asked
    job, limit = asked
    return _json(audit_json(config(request).store.control.entries(job, limit)))


async def act(request: Request) -> Response:
    """POST an action: ``/jobs/{job}/{action}``, ``/runs/{id}/kill``,
    ``/pause``, ``/resume``, ``/hosts/{host}/drain`` and ``undrain``; a JSON
    body may give ``reason``, ``for``, ``until``."""
    from starlette.concurrency import run_in_threadpool

    from dblockrun.ops.output import strict_json

    action = request.path_params.get("action") or request.url.path.rsplit("/", 1)[1]
    role = ROLE_OF.get(action)
    if role is None:
        return error(404, f"no action {action!r}")
    refused = refusal(request, role, request.headers.get("x-csrf-token"))
    if refused is not None:
        return error(*refused)
    cfg, user = config(request), current_user(request)
    assert user is not None
    body: Any = {}
    raw = await request.body()  # at most 64 KiB (middleware.py)
    if raw.strip():
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: [[[[... nested too deep
            return error(400, "the body is not JSON")
    if not isinstance(body, dict) or set(body) - {"reason", "for", "until"} or not all(
            isinstance(v, str | None) for v in body.values()):
        return error(400, "the body takes only reason, for and until (strings)")
    run_id = _run_id(request) if "run_id" in request.path_params else None
    if "run_id" in request.path_params and run_id is None:
        return error(404, f"no run {request.path_params['run_id']}")
    asked = ActionRequest(action, request.path_params.get("job"), body.get("reason"),
                          body.get("for"), body.get("until"), run_id,
                          request.path_params.get("host"))
    try:
        said, doc = await run_in_threadpool(perform, cfg.store, user.name, asked)
        cfg.status.forget()
    except UsageError as exc:
        return error(404 if exc.message.startswith("no such job") else 400,
                     public(cfg.store, exc.message))
    except DatabaseError:
        raise  # 503 (errors.py)
    except DblockrunError as exc:
        return error(409, public(cfg.store, exc.message))
    return _json(strict_json({"ok": True, "message": said, **doc}))


def openapi(_request: Request) -> Response:
    return JSONResponse(OPENAPI)


def routes() -> list[Route]:
    return [
        Route("/api/v1/status", status),
        Route("/api/v1/history", history),
        Route("/api/v1/runs/{run_id}", run),
        Route("/api/v1/runs/{run_id}/output", output),
        Route("/api/v1/runs/{run_id}/kill", act, methods=["POST"]),
        Route("/api/v1/audit", audit),
        Route("/api/v1/jobs/{job}/{action}", act, methods=["POST"]),
        Route("/api/v1/pause", act, methods=["POST"]),
        Route("/api/v1/resume", act, methods=["POST"]),
        Route("/api/v1/hosts/{host}/drain", act, methods=["POST"]),
        Route("/api/v1/hosts/{host}/undrain", act, methods=["POST"]),
        Route("/api/v1/openapi.json", openapi),
    ]
