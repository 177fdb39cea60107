#!/usr/bin/env python3
"""Takes the README's dashboard screenshot: headless Chromium, through ChromeDriver's
WebDriver API, loads a running `rollcall dashboard` and saves a PNG once the page
shows `--rows` silo rows and drawn charts.

    scripts/dashboard-screenshot.py http://127.0.0.1:8080/ docs/dashboard.png [--rows 3]

Needs Debian's chromium and chromium-driver (what scripts/test.sh installs).
"""
import argparse
import base64
import json
import socket
import subprocess
import tempfile
import time
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("out")
parser.add_argument("--rows", type=int, default=3)
args = parser.parse_args()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{port}"


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["value"]


try:
    for _ in range(100):
        try:
            call("GET", "/status")
            break
        except OSError:
            time.sleep(0.1)
    profile = tempfile.mkdtemp()
    session = call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
        "binary": "/usr/bin/chromium",
        "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"]}}}})["sessionId"]
    call("POST", f"/session/{session}/url", {"url": args.url})
    script = ("return [document.querySelectorAll('#silos tbody tr').length,"
              " document.querySelectorAll('#charts polyline').length];")
    for _ in range(300):
        rows, lines = call("POST", f"/session/{session}/execute/sync", {"script": script, "args": []})
        if rows >= args.rows and lines > 0:
            break
        time.sleep(0.1)
    time.sleep(1)
    png = base64.b64decode(call("GET", f"/session/{session}/screenshot"))
    with open(args.out, "wb") as f:
        f.write(png)
    call("DELETE", f"/session/{session}")
    print(f"{args.out}: {len(png)} bytes, {rows} rows")
finally:
    driver.kill()
