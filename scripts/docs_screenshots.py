#!/usr/bin/env python
"""The docs' screenshot of a job page with live charts, docs/img/job-page.png, made against the real product.

    .venv/bin/python scripts/docs_screenshots.py [--out docs/img/job-page.png] [--epochs 200]

What it does: starts the product as `make run` does (`scripts/run_local.py`: embedded PostgreSQL and Redis, the web
server, the orchestrator, the scheduler's and webhooks' workers, the ingest and two local agents), in a `var/` folder
of its own (`var/docs-screenshot/`) on free ports, so it runs beside a `make run` or a test suite. It signs in through
the REST API as an admin it names, submits the built-in `digits_mlp` program as a MultiWorkerMirrored job of two
workers (one on each local agent), opens the job's page in headless Chromium (Debian's `/usr/bin/chromium` through
Playwright) while the job trains, waits until the page has drawn its charts and received live points over its socket,
and saves the page's head (title, state, task table) above its live charts as a PNG. Then it cancels the job and stops
the stack (SIGTERM; nothing it started outlives it, as with `make run`). About two minutes on the 2-core development
machine, most of it TensorFlow starting in the tasks.

Needs: `make install` done (the venv: Playwright, and Pillow, which TensorBoard brings), Debian's chromium package.
The PNG is kept under 300 KB (a 256-colour palette when the full colours would be larger; the script fails, saying
so, if it still is not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("TFDASH_CHROMIUM", "/usr/bin/chromium")
VAR = ROOT / "var" / "docs-screenshot"
MAX_BYTES = 300 * 1024
ADMIN = "admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, check: Any, timeout: float, every: float = 1.0) -> Any:
    """Poll `check` until it returns something true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"docs_screenshots: timed out waiting for {what}")
        time.sleep(every)


class ApiError(Exception):
    pass


class Api:
    def __init__(self, base: str) -> None:
        self.base = base
        self.token = ""

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(  # noqa: S310 - our own local URL
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Token {self.token}"} if self.token else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - our own local URL
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc
        return json.loads(text) if text else None


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - our own local URL
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start_stack(password: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        TFDASH_VAR_DIR=str(VAR),
        PORT=str(port),
        TFDASH_PG_PORT=str(free_port()),
        TFDASH_REDIS_PORT=str(free_port()),
        DJANGO_SUPERUSER_USERNAME=ADMIN,
        DJANGO_SUPERUSER_PASSWORD=password,
    )
    VAR.mkdir(parents=True, exist_ok=True)
    out = log.open("wb")
    # --exit-with-parent: the stack stops if this script dies, as `make run` stops with make.
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "run_local.py"), "--exit-with-parent"],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def hosts_online(api: Api) -> bool:
    clusters = api.call("GET", "/api/clusters/")
    rows = clusters["results"] if isinstance(clusters, dict) else clusters
    local = [c for c in rows if c["name"] == "local"]
    if not local:
        return False
    hosts = api.call("GET", f"/api/clusters/{local[0]['id']}/hosts/")
    hosts = hosts["results"] if isinstance(hosts, dict) else hosts
    return len([h for h in hosts if h["status"] == "online"]) >= 2


def screenshot(base: str, password: str, job_id: int, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 960})
            page.goto(f"{base}/accounts/login/?next=/jobs/{job_id}/")
            page.fill("#id_username", ADMIN)
            page.fill("#id_password", password)
            page.click("form.login button[type=submit]")
            page.wait_for_url(f"**/jobs/{job_id}/", timeout=60_000)
            # The first chart drawn, then live points over the socket while the job trains.
            page.wait_for_function("() => window.tfdashLive && window.tfdashLive.firstDrawMs", timeout=120_000)
            page.wait_for_function(
                "() => tfdashLive.pointsReceived >= 400 && tfdashLive.redraws >= 10", timeout=300_000, polling=500
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            compose(page, out)
        finally:
            browser.close()


def compose(page: Any, out: Path) -> None:
    """The page's head (title, state, the task table) above its live charts, cut from a full-page screenshot."""
    import io

    from PIL import Image

    rects = page.evaluate(
        """() => {
            const box = (el) => { const r = el.getBoundingClientRect();
                                  return [r.top + window.scrollY, r.bottom + window.scrollY]; };
            const table = document.querySelector("#job-live table");
            return {head: box(table), charts: box(document.querySelector("#charts")),
                    metrics: box(document.querySelector("#live-metrics"))};
        }"""
    )
    shot = Image.open(io.BytesIO(page.screenshot(full_page=True)))
    width = shot.width
    head = shot.crop((0, 0, width, int(rects["head"][1]) + 16))
    top, bottom = int(rects["metrics"][0]) - 8, int(rects["charts"][1]) + 8
    charts = shot.crop((0, top, width, min(bottom, top + 1100)))
    picture = Image.new("RGB", (width, head.height + charts.height), "white")
    picture.paste(head, (0, 0))
    picture.paste(charts, (0, head.height))
    picture.save(out, optimize=True)
    if out.stat().st_size > MAX_BYTES:  # a palette of 256 colours draws these charts the same, in a third of the bytes
        picture.quantize(colors=256).save(out, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "job-page.png")
    parser.add_argument("--epochs", type=int, default=200, help="long enough to be training when the picture is taken")
    args = parser.parse_args()

    password = secrets.token_urlsafe(16)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = VAR / "run.log"
    VAR.mkdir(parents=True, exist_ok=True)
    stack = start_stack(password, port, log)
    print(f"docs_screenshots: the product starting on {base} (log: {log})", flush=True)
    api = Api(base)
    job_id = None
    try:
        until("the web server", lambda: stack.poll() is None and answers(f"{base}/accounts/login/"), 900, 2)
        api.token = api.call("POST", "/api/token/", {"username": ADMIN, "password": password, "name": "docs"})["token"]
        until("both local agents online", lambda: hosts_online(api), 300, 2)

        def submit() -> dict[str, Any] | None:
            try:
                return dict(api.call("POST", "/api/jobs/", body))
            except ApiError as exc:
                if "not probed yet" in str(exc):  # the agents probe the task environment after their hello
                    return None
                raise

        body = {
            "name": "digits, two workers",
            "strategy": "multi_worker_mirrored",
            "workers": 2,
            "devices_per_worker": 1,
            "builtin": "digits_mlp",
            "builtin_config": {"epochs": args.epochs},
        }
        job = until("the agents' probe of the task environment", submit, 300, 2)
        job_id = int(job["id"])
        print(f"docs_screenshots: job {job_id} submitted", flush=True)
        until("the job to run", lambda: api.call("GET", f"/api/jobs/{job_id}/")["state"] == "running", 300, 1)
        screenshot(base, password, job_id, args.out)
        size = args.out.stat().st_size
        print(f"docs_screenshots: wrote {args.out} ({size // 1024} KB)", flush=True)
        if size > MAX_BYTES:
            print(f"docs_screenshots: {args.out} is over {MAX_BYTES // 1024} KB", file=sys.stderr)
            return 1
        return 0
    finally:
        if job_id is not None:
            with contextlib.suppress(OSError, ApiError):
                api.call("POST", f"/api/jobs/{job_id}/cancel/")
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stack.kill()


if __name__ == "__main__":
    sys.exit(main())
