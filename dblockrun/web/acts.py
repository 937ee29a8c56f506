"""The dashboard's and the API's actions: each one the operator command's
own function (``dblockrun/ops``, the store), audited with the signed-in user.

Nothing here takes a command or a job definition: an action names a job the
database knows, or a run, and at most a reason and a duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dblockrun.errors import UsageError
from dblockrun.store.control import Audit

if TYPE_CHECKING:
    from dblockrun.store.roles import Control

#: Every action, and the least role each needs.
ROLE_OF = {"run": "operator", "disable": "operator", "enable": "operator",
           "kill": "operator", "unlock": "admin", "pause": "admin", "resume": "admin",
           "drain": "admin", "undrain": "admin"}
ACTIONS = tuple(ROLE_OF)
#: Those that act on one job (pause and resume: on the fleet).
JOB_ACTIONS = ("run", "disable", "enable", "kill", "unlock")
#: Those that act on one host (dblockrun drain, undrain).
HOST_ACTIONS = ("drain", "undrain")
#: Those that stop or take away something (styled so; each behind its confirmation).
DESTRUCTIVE = ("kill", "unlock", "pause", "drain")
#: The reason column's size (store/schema.py).
MAX_REASON = 1000


@dataclass(frozen=True)
class ActionRequest:
    """An action asked for on the dashboard or through the API."""

    action: str
    job: str | None = None
    reason: str | None = None
    #: disable and pause: a duration (``3h``); disable: or an ISO time.
    for_: str | None = None
    until: str | None = None
    #: kill: this run instead of the job's.
    run_id: int | None = None
    #: drain and undrain: the host (its ``hostname`` label).
    host: str | None = None


def offered(job: dict[str, Any] | None) -> list[str]:
    """The job actions its page offers, as its state (``status --json``'s
    entry) makes sense of them: Enable only when disabled, Disable only when
    not; Kill only while a run of it runs; Unlock only while its lock is held.
    (Each action still checks for itself: a page can be old.)"""
    if job is None:
        return ["run"]
    disabled = job["state"] == "disabled"
    out = ["run", "enable" if disabled else "disable"]
    if job["running"] is not None or job["runs"]:
        out.append("kill")
    if job["holder"]:
        out.append("unlock")
    return out


def who(user: str) -> str:
    """How the audit trail names a dashboard user (not the server's OS user)."""
    return f"web:{user}"


def perform(store: Control, user: str, act: ActionRequest) -> tuple[str, dict[str, Any]]:
    """Do ``act`` as ``user``: (what was done, in a sentence; the same as JSON).
    UsageError (bad input, no such job) or DblockrunError (it cannot be done)."""
    from dblockrun.ops import actions as ops
    from dblockrun.ops.output import pause_json, run_json
    from dblockrun.timetext import iso

    if act.action not in ACTIONS:
        raise UsageError(f"no action {act.action!r}")
    for what, value in (("job", act.job), ("reason", act.reason), ("for", act.for_),
                        ("until", act.until), ("host", act.host)):
        check_text(what, value)
    reason = (act.reason or "").strip() or None
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"reason is {len(reason)} characters long (at most {MAX_REASON})")
    job = act.job
    if act.action in JOB_ACTIONS and act.action != "kill" and not job:
        raise UsageError(f"{act.action}: which job?")
    seconds = _seconds(act.for_)
    by = who(user)

    def audit(action: str, detail: str | None = None) -> Audit:
        return Audit(by, action, job, detail, reason)

    if act.action == "run":
        assert job is not None
        ops.request_runs(store, job, None, audit("run"))
        why = ops.not_now(store, job, store.live_hosts())
        note = f"; {why}" if why else ""
        return f"{job}: run requested{note}", {"job": job, "requested": True, "note": why}
    if act.action == "disable":
        assert job is not None
        if act.for_ and act.until:
            raise UsageError("give for or until, not both")
        from dblockrun.timetext import parse_time

        until = parse_time(act.until, "until") if act.until else None
        detail = (f"for {act.for_}" if act.for_ else f"until {act.until}" if act.until
                  else "until enabled")
        done = ops.disable_job(store, job, for_seconds=seconds, until=until, reason=reason,
                               audit=audit("disable", detail))
        return (f"{job} disabled until {iso(done.until)}",
                {"job": job, "disabled_until": iso(done.until)})
    if act.action == "enable":
        assert job is not None
        cleared = ops.enable_job(store, job, audit("enable"))
        return (f"{job} enabled" if cleared else f"{job} was not disabled: nothing to do",
                {"job": job, "enabled": cleared})
    if act.action == "unlock":
        assert job is not None
        token = store.force_unlock(job, audit("unlock"))
        if token is None:
            raise ops.no_such_job(store, [job])
        return f"{job} unlocked (token now {token})", {"job": job, "token": token}
    if act.action == "kill":
        from dblockrun.ops.kill import kill

        if (job is None) == (act.run_id is None):
            raise UsageError("kill: give a job or a run")
        runs = kill(store, by, job=job, run_id=act.run_id, reason=reason, wait=None)
        ids = ", ".join(str(r.id) for r in runs)
        return (f"kill requested for run {ids}; its holder stops it at its next heartbeat",
                {"killing": [run_json(r) for r in runs]})
    if act.action in HOST_ACTIONS:
        return _host_action(store, by, act, reason, seconds)
    if act.action == "pause":
        entry = Audit(by, "pause", None, f"for {act.for_}" if act.for_ else None, reason)
        paused = store.control.pause(entry, seconds)
        return "fleet paused: no new run starts", {"paused": pause_json(paused)}
    was = store.control.resume(Audit(by, "resume", None, None, reason))
    return ("fleet resumed" if was else "the fleet was not paused",
            {"resumed": was is not None})


def _host_action(store: Control, by: str, act: ActionRequest, reason: str | None,
                 seconds: float | None) -> tuple[str, dict[str, Any]]:
    """drain and undrain, as ``dblockrun drain HOST`` (a host no live
    daemon has is refused: there is no --force here)."""
    from dblockrun.ops import drain as ops
    from dblockrun.ops.output import drain_json

    host = act.host
    if not host or act.job:
        raise UsageError(f"{act.action}: which host?")
    if act.action == "drain":
        detail = f"host {host}" + (f" for {act.for_}" if act.for_ else "")
        done = ops.drain(store, host, Audit(by, "drain", None, detail, reason), seconds)
        going = len(ops.host_runs(store, host))
        return (f"host {host} drained {ops.until_text(done)}: it starts nothing new; "
                f"{going} run(s) going there finish", {"drained": drain_json(done)})
    was = ops.undrain(store, host, Audit(by, "undrain", None, f"host {host}", reason))
    return (f"host {host} undrained: it claims slots again" if was
            else f"host {host} was not drained", {"host": host, "undrained": was is not None})


def check_text(what: str, value: str | None) -> None:
    """UsageError (400) for text no table can hold: a NUL (PostgreSQL's
    text cannot), or a lone surrogate (not UTF-8: ``{"reason": "\\ud800"}``)."""
    if value is None:
        return
    if "\x00" in value:
        raise UsageError(f"{what}: a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what}: not UTF-8 text (a lone surrogate)") from None


def _seconds(text: str | None) -> float | None:
    from dblockrun.durations import parse_option_duration

    if not text:
        return None
    try:
        seconds = parse_option_duration(text)
    except ValueError as exc:
        raise UsageError(f"for: {exc}") from exc
    if seconds <= 0:
        raise UsageError(f"for: must be longer than 0s (got {text!r})")
    return seconds
