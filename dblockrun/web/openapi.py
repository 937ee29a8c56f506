"""The API's OpenAPI document, served at ``/api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

#: What any request may get (dblockrun/web/limits.py, errors.py).
_ANY = {"400": {"description": "bad input (a NUL in the path or query ...)"},
        "413": {"description": "a body over 64 KiB"},
        "503": {"description": "the database is not answering"}}


def _get(summary: str, params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": params or [],
                    "responses": {"200": {"description": "JSON (the CLI's --json shape)"},
                                  "401": {"description": "sign in first"},
                                  "404": {"description": "no such job or run"}, **_ANY}}}


def _post(summary: str, params: list[dict[str, Any]], body: bool = True) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary, "parameters": params,
        "security": [{"token": []}, {"session": [], "csrf": []}],
        "responses": {"200": {"description": "done: {ok, message, ...}"},
                      "400": {"description": "bad input"},
                      "401": {"description": "sign in first"},
                      "403": {"description": "role, CSRF token, or read-only server"},
                      "404": {"description": "no such job or run"},
                      "409": {"description": "cannot be done now (e.g. not running)"},
                      **{k: v for k, v in _ANY.items() if k != "400"}}}
    if body:
        op["requestBody"] = {"required": False, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ActionBody"}}}}
    return {"post": op}


def _param(name: str, where: str = "query", kind: str = "string",
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path",
            "schema": {"type": kind}}


_JOB, _RUN = _param("job", "path"), _param("run_id", "path", "integer")

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "dblockrun", "version": "1",
             "description": "The fleet's jobs, runs and operator actions. No endpoint "
                            "accepts a command or a job definition."},
    "paths": {
        "/api/v1/status": _get("Jobs, live hosts, groups, pause: `status --json`",
                               [_param("job")]),
        "/api/v1/history": _get("Runs, newest first: `history --json`",
                                [_param("job"), _param("item"), _param("limit", kind="integer")]),
        "/api/v1/runs/{run_id}": _get("One run", [_RUN]),
        "/api/v1/runs/{run_id}/output": _get(
            "A run and its output tail (escaped); live: a running run's tail so far", [_RUN]),
        "/api/v1/audit": _get("Operator actions: `audit --json`",
                              [_param("job"), _param("limit", kind="integer")]),
        "/api/v1/jobs/{job}/run": _post("Run now (operator)", [_JOB]),
        "/api/v1/jobs/{job}/disable": _post("Disable, for or until, with a reason (operator)",
                                            [_JOB]),
        "/api/v1/jobs/{job}/enable": _post("Enable (operator)", [_JOB]),
        "/api/v1/jobs/{job}/kill": _post("Kill its running runs (operator)", [_JOB]),
        "/api/v1/runs/{run_id}/kill": _post("Kill one run (operator)", [_RUN]),
        "/api/v1/jobs/{job}/unlock": _post("Free its lock (admin)", [_JOB]),
        "/api/v1/pause": _post("Pause the fleet (admin)", []),
        "/api/v1/resume": _post("Resume the fleet (admin)", []),
        "/api/v1/hosts/{host}/drain": _post(
            "Drain a live host, for a while or until undrained, with a reason (admin)",
            [_param("host", "path")]),
        "/api/v1/hosts/{host}/undrain": _post("Undrain a host (admin)", [_param("host", "path")]),
    },
    "components": {
        "schemas": {"ActionBody": {"type": "object", "additionalProperties": False,
                                   "properties": {
                                       "reason": {"type": "string", "maxLength": 1000},
                                       "for": {"type": "string", "examples": ["3h"]},
                                       "until": {"type": "string",
                                                 "examples": ["2026-12-01T06:00:00Z"]}}}},
        "securitySchemes": {
            "token": {"type": "http", "scheme": "bearer"},
            "session": {"type": "apiKey", "in": "cookie", "name": "dblockrun_session"},
            "csrf": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token"},
        },
    },
}
