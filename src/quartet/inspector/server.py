"""The `quartet inspect` server: a read-only JSON API over run folders and the page that draws it.

aiohttp (the stack of quartet's OpenAI server) serves `static/` (one page: HTML, CSS, JS, no third-party
assets, so nothing is fetched from the network) and:

    GET /api/runs                                   the runs shown (the first, then `--compare` ones)
    GET /api/run/{run}/curves                       panels of `quartet plot` and every metric, as points
    GET /api/run/{run}/steps                        recorded steps (each with its alarm's phase, if any)
    GET /api/run/{run}/alarms                       the run's alarm records (mismatch, no signal)
    GET /api/run/{run}/step/{step}/samples?...      one page of samples after filters (`SampleFilter`)
    GET /api/run/{run}/step/{step}/sample/{row}     one sample with per-token values
    GET /api/run/{run}/step/{step}/group/{uid}      the samples of one prompt
    GET /api/run/{run}/find?prompt=..&index=..      the same prompt's samples at every step of a run
    GET /api/run/{run}/image?path=rollouts/images/<sha256>.<ext>   a sample's image (vision-language runs)

Only GET is routed, every path is resolved inside the run folders given on the command line (run names
are indices, never paths; an image is served only from its run's `rollouts/images/`, by the name its record
gives), and bad parameters are 400 with the parameter named.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from quartet.inspector.run_data import RunData, SampleFilter

__all__ = ["InspectServer", "build_app", "serve"]

log = logging.getLogger(__name__)
_STATIC = resources.files("quartet.inspector") / "static"
_RUNS = web.AppKey("runs", list[RunData])


class _BadParam(ValueError):
    pass


def _run(request: web.Request) -> RunData:
    runs = request.app[_RUNS]
    key = request.match_info["run"]
    if not key.isdigit() or int(key) >= len(runs):
        raise web.HTTPNotFound(text=f"no run {key!r}; runs are 0..{len(runs) - 1}")
    return runs[int(key)]


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _BadParam(f"{name} must be an integer, got {value!r}") from None


def _float(query: Any, name: str) -> float | None:
    raw = query.get(name, "")
    if raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise _BadParam(f"{name} must be a number, got {raw!r}") from None


def _flag(query: Any, name: str) -> bool | None:
    raw = query.get(name, "")
    if raw == "":
        return None
    if raw not in ("true", "false"):
        raise _BadParam(f"{name} must be true or false, got {raw!r}")
    return bool(raw == "true")


def _filter(query: Any) -> SampleFilter:
    limit = _int(query.get("limit", "200"), "limit")
    if not 1 <= limit <= 5000:
        raise _BadParam(f"limit must lie in 1..5000, got {limit}")
    return SampleFilter(
        text=query.get("text", "")[:200],
        min_score=_float(query, "min_score"),
        max_score=_float(query, "max_score"),
        truncated=_flag(query, "truncated"),
        min_drift=_float(query, "min_drift"),
        data_source=query.get("data_source", ""),
        tool_errors=_flag(query, "tool_errors"),
        sort=query.get("sort", "row"),
        descending=query.get("order", "asc") == "desc",
        offset=max(0, _int(query.get("offset", "0"), "offset")),
        limit=limit,
    )


async def _json(request: web.Request, fn: Any, *args: Any) -> web.Response:
    """Run the (file-reading) `fn` off the event loop; map our errors to 400/404."""
    try:
        result = await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    except _BadParam as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    except KeyError as err:
        raise web.HTTPNotFound(text=str(err.args[0] if err.args else err)) from None
    except ValueError as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    return web.json_response(result)


async def runs(request: web.Request) -> web.Response:
    shown: list[RunData] = request.app[_RUNS]
    listing = [{"id": i, "name": r.name, "path": str(r.path)} for i, r in enumerate(shown)]
    return web.json_response(listing)


async def curves(request: web.Request) -> web.Response:
    return await _json(request, _run(request).curves)


async def steps(request: web.Request) -> web.Response:
    return await _json(request, _run(request).steps)


async def alarms(request: web.Request) -> web.Response:
    return await _json(request, _run(request).alarms)


async def samples(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        step, flt = _int(request.match_info["step"], "step"), _filter(request.query)
    except _BadParam as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    return await _json(request, run.samples, step, flt)


async def sample(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        step, row = _int(request.match_info["step"], "step"), _int(request.match_info["row"], "row")
    except _BadParam as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    return await _json(request, run.sample, step, row)


async def group(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        step = _int(request.match_info["step"], "step")
    except _BadParam as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    return await _json(request, run.group, step, request.match_info["uid"])


async def find(request: web.Request) -> web.Response:
    run = _run(request)
    prompt, raw_index = request.query.get("prompt", ""), request.query.get("index", "")
    try:
        index = _int(raw_index, "index") if raw_index not in ("", "null") else None
    except _BadParam as err:
        raise web.HTTPBadRequest(text=str(err)) from None
    return await _json(request, run.find_prompt, prompt, index)


async def image(request: web.Request) -> web.StreamResponse:
    """A sample's image file, by the run-relative path its record names; 400 for a path of another form,
    404 for a file that is not in the run's images folder."""
    run = _run(request)
    try:
        file, kind = run.image_file(request.query.get("path", ""))
    except ValueError as err:
        raise web.HTTPBadRequest(text=f"path: {err}") from None
    except KeyError as err:
        raise web.HTTPNotFound(text=str(err.args[0] if err.args else err)) from None
    # named by their content: a file never changes, so the browser may keep it
    headers = {"Content-Type": kind, "Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"}
    return web.FileResponse(file, headers=headers)


async def page(request: web.Request) -> web.Response:
    return web.Response(text=(_STATIC / "index.html").read_text(encoding="utf-8"), content_type="text/html")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kinds = {".js": "application/javascript", ".css": "text/css"}
    kind = kinds.get(Path(name).suffix)
    file = _STATIC / name
    if kind is None or "/" in name or not file.is_file():
        raise web.HTTPNotFound(text=f"no asset {name!r}")
    return web.Response(text=file.read_text(encoding="utf-8"), content_type=kind)


def build_app(run_dirs: list[Path]) -> web.Application:
    """The app over `run_dirs` (the first is the main run, the others are compared with it)."""
    app = web.Application()
    app[_RUNS] = [RunData(Path(p)) for p in run_dirs]
    names = [r.name for r in app[_RUNS]]
    for run in app[_RUNS]:  # two runs named alike (two seeds' `grpo`) stay apart on the page
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.name}"
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", asset)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/run/{run}/curves", curves)
    app.router.add_get("/api/run/{run}/steps", steps)
    app.router.add_get("/api/run/{run}/alarms", alarms)
    app.router.add_get("/api/run/{run}/step/{step}/samples", samples)
    app.router.add_get("/api/run/{run}/step/{step}/sample/{row}", sample)
    app.router.add_get("/api/run/{run}/step/{step}/group/{uid}", group)
    app.router.add_get("/api/run/{run}/find", find)
    app.router.add_get("/api/run/{run}/image", image)
    return app


def serve(run_dirs: list[Path], host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the page until interrupted."""
    web.run_app(build_app(run_dirs), host=host, port=port, print=None, access_log=None)


class InspectServer:
    """The page served from a background thread (tests, benchmarks, notebooks): `with InspectServer(dirs)
    as url: ...`; port 0 picks a free port. Start and stop are bounded by `timeout_s`."""

    def __init__(self, run_dirs: list[Path], host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0):
        self.app = build_app(run_dirs)
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="quartet-inspect", daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> str:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(self.timeout_s)
        return self.url

    async def _start(self) -> str:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://{self.host}:{port}"

    def __exit__(self, *exc: object) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(self.timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout_s)
