"""A small threaded HTTP/1.1 file server for the remote-source tests.

Serves a directory on 127.0.0.1 (ephemeral port) with HEAD, GET and
single-range requests (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``), and can
inject faults into the responses to chosen paths:

* ``fail_first``: the first N matching requests answer 500;
* ``reset_first``: the next N matching GETs send the headers and half the
  body, then reset the connection (RST);
* ``truncate_first``: the next N matching GETs promise the full length but
  send half the body and close;
* ``slow_s``: every matching response waits this long first (bounded);
* ``no_range``: ignore Range headers (answer 200 with the whole file);
* ``always_fail``: every matching request answers 503;
* ``fail_after``: after N matching requests served, every further one
  answers 503 (an outage in the middle of reading a file);
* ``outage_s``: every matching request answers 503 until this many seconds
  after the first matching one (an outage of a known length);
* ``unavailable_first``: the first N matching requests answer 503;
* ``always_drop``: every matching request gets no answer: the connection is
  reset as soon as the request is read (HEAD included);
* ``retry_after``: a ``Retry-After`` value sent with every injected 500/503;
* ``methods``: only requests with these methods match (e.g. ``("GET",)``:
  HEADs pass, so a dataset opens and its reads then fail).

Every request is logged (method, path, Range); every request matching a
fault plan is also timestamped in ``Faults.times`` as (time.monotonic(),
method, path, fault or None). The server stops by itself after
``lifetime_s`` even if a test forgets to stop it, and ``stop()`` / the
context manager stop it at once. Loopback only.
"""
import http.server
import os
import re
import socket
import struct
import threading
import time
import urllib.parse

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class Faults:
    """Fault plan, shared by the handler threads (guarded by a lock)."""

    def __init__(self, match="", fail_first=0, reset_first=0, truncate_first=0, slow_s=0.0, no_range=False,
                 always_fail=False, fail_after=None, outage_s=0.0, unavailable_first=0, retry_after=None,
                 always_drop=False, methods=None):
        self.match = match
        self.methods = tuple(methods) if methods else None
        self.always_drop = always_drop
        self.fail_first = fail_first
        self.reset_first = reset_first
        self.truncate_first = truncate_first
        self.slow_s = min(float(slow_s), 30.0)
        self.no_range = no_range
        self.always_fail = always_fail
        self.fail_after = fail_after
        self.outage_s = min(float(outage_s), 60.0)
        self.unavailable_first = unavailable_first
        self.retry_after = retry_after
        self.first_at = None
        self.times = []
        self.injected = {"500": 0, "503": 0, "reset": 0, "truncate": 0, "slow": 0, "drop": 0}
        self.lock = threading.Lock()

    def matches(self, path, method):
        return self.match in path and (self.methods is None or method in self.methods)

    def take(self, path, method):
        """The fault for this request: None, "500", "503", "reset", "truncate", "drop"."""
        if not self.matches(path, method):
            return None
        with self.lock:
            now = time.monotonic()
            fault = self._take(now, method)
            self.times.append((now, method, path, fault))
            return fault

    def _take(self, now, method):
        """take() under the lock."""
        if self.first_at is None:
            self.first_at = now
        if self.outage_s and now - self.first_at < self.outage_s:
            self.injected["503"] += 1
            return "503"
        if self.unavailable_first > 0:
            self.unavailable_first -= 1
            self.injected["503"] += 1
            return "503"
        if self.fail_after is not None:
            if self.fail_after > 0:
                self.fail_after -= 1
                return None
            self.injected["503"] += 1
            return "503"
        if self.always_fail:
            self.injected["503"] += 1
            return "503"
        if self.always_drop:
            self.injected["drop"] += 1
            return "drop"
        if self.fail_first > 0:
            self.fail_first -= 1
            self.injected["500"] += 1
            return "500"
        if method == "GET" and self.reset_first > 0:
            self.reset_first -= 1
            self.injected["reset"] += 1
            return "reset"
        if method == "GET" and self.truncate_first > 0:
            self.truncate_first -= 1
            self.injected["truncate"] += 1
            return "truncate"
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "vlafeed-test-server"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _file(self):
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        root = self.server.root
        full = os.path.realpath(os.path.join(root, rel))
        if not (full == root or full.startswith(root + os.sep)) or not os.path.isfile(full):
            return None, rel
        return full, rel

    def _plain(self, code, text, close=False, retry_after=None):
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset(self):
        """Ends the connection with RST (SO_LINGER 0: close() sends RST instead of FIN)."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _serve(self):
        srv = self.server
        path = urllib.parse.urlsplit(self.path).path
        rng = self.headers.get("Range")
        with srv.log_lock:
            srv.log.append((self.command, path, rng))
        faults = srv.faults
        fault = faults.take(path, self.command) if faults else None
        if faults and faults.slow_s and faults.matches(path, self.command):
            with faults.lock:
                faults.injected["slow"] += 1
            time.sleep(faults.slow_s)
        if fault in ("500", "503"):
            self._plain(int(fault), "injected failure\n", retry_after=faults.retry_after)
            return
        if fault == "drop":
            self._reset()
            return
        full, _ = self._file()
        if full is None:
            self._plain(404, "not found\n")
            return
        size = os.path.getsize(full)
        start, end, partial = 0, size - 1, False
        if rng and not (faults and faults.no_range):
            m = _RANGE.match(rng.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                self._plain(400, "bad range\n")
                return
            if m.group(1) == "":
                n = int(m.group(2))
                start, end = max(0, size - n), size - 1
            else:
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else size - 1
                end = min(end, size - 1)
            if start >= size or end < start:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            partial = True
        length = end - start + 1 if size else 0
        self.send_response(206 if partial else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        if fault in ("reset", "truncate"):
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(full, "rb") as f:
            f.seek(start)
            data = f.read(length)
        if fault == "reset":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._reset()
            return
        if fault == "truncate":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    do_HEAD = do_GET


class RemoteServer:
    """``with RemoteServer(root, Faults(...)) as srv: url = srv.url("ds")``."""

    def __init__(self, root, faults=None, lifetime_s=300.0):
        self.root = os.path.realpath(os.fspath(root))
        self.faults = faults
        self.lifetime_s = lifetime_s
        self._httpd = None
        self._thread = None
        self._timer = None
        self._stopped = False
        self._stop_lock = threading.Lock()

    def start(self):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        httpd.root = self.root
        httpd.faults = self.faults
        httpd.log = []
        httpd.log_lock = threading.Lock()
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    @property
    def port(self):
        return self._httpd.server_address[1]

    def url(self, rel=""):
        return f"http://127.0.0.1:{self.port}/{rel}"

    @property
    def log(self):
        with self._httpd.log_lock:
            return list(self._httpd.log)

    def stop(self):
        with self._stop_lock:
            if self._stopped or self._httpd is None:
                return
            self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._timer is not None and threading.current_thread() is not self._timer:
            self._timer.cancel()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


if __name__ == "__main__":  # manual use: python3 remote_server.py DIR
    import sys

    with RemoteServer(sys.argv[1], lifetime_s=3600) as s:
        print(s.url(), flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


# ---- S3 through moto's server (the moto_endpoint fixture is in conftest.py) -------------------


def upload_tree(endpoint, bucket, local_root, prefix):
    """Creates `bucket` and uploads every file below local_root as prefix/<relative path>."""
    import boto3
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    s3.create_bucket(Bucket=bucket)
    for dirpath, _, files in os.walk(local_root):
        for name in files:
            full = os.path.join(dirpath, name)
            key = prefix + "/" + os.path.relpath(full, local_root).replace(os.sep, "/")
            s3.upload_file(full, bucket, key)


def s3_env(endpoint):
    """The environment that points vlafeed's S3 client at the moto server."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1"}
