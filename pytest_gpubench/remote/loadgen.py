"""The load generator that runs on the instance, next to the model.

Standard library only: it is sent over SSH as the stdin of ``python3 - CONFIG``
and must run on any instance with a Python 3. It streams one JSON event per
line on stdout (seed 004's event protocol, extended):

    {"event": "connection", "status": "connected", "url": ...}
    {"event": "worker", "status": "warmup" | "running"}
    {"event": "request", <RequestRecord fields>}
    {"event": "progress", "requests", "tokens", "tps", "errors", "elapsed"}
    {"event": "finish", "status": "completed" | "interrupted" | "failed",
     "duration_seconds", "message"}

It also checkpoints every record to a JSON file on the instance (seed 001's
format), so a lost connection loses nothing that was measured. If stdout goes
away it keeps running to the end and only the checkpoint remains.
"""

import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse

STOP = threading.Event()


class Emitter:
    """Writes events to stdout; survives a closed stdout (connection lost)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.alive = True

    def emit(self, event, **fields):
        if not self.alive:
            return
        line = json.dumps(dict(event=event, **fields), separators=(",", ":"))
        with self.lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.alive = False


def ollama_address(url):
    parsed = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    return parsed.hostname or "127.0.0.1", parsed.port or 11434


def generate(address, model, prompt, max_tokens, timeout):
    """One streamed /api/generate request; returns the record fields."""
    body = json.dumps(
        {"model": model, "prompt": prompt, "stream": True, "options": {"num_predict": max_tokens}}
    )
    started_at = time.time()
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    final = {}
    conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request("POST", "/api/generate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(2000).decode("utf-8", "replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise RuntimeError(f"HTTP {response.status}: {detail}")
        while True:
            line = response.readline()
            if not line:
                raise RuntimeError("stream ended before the final chunk")
            chunk = json.loads(line)
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"]))
            now = time.perf_counter()
            if chunk.get("response"):
                tokens += 1
                last = now
                if first is None:
                    first = now
            if chunk.get("done"):
                final = chunk
                break
        end = time.perf_counter()
    finally:
        conn.close()
    ttft_ms = (first - t0) * 1000 if first is not None else None
    latency_ms = (end - t0) * 1000
    tps = None
    if tokens >= 2 and first is not None and last > first:
        tps = (tokens - 1) / (last - first)
    return {
        "started_at": started_at,
        "ttft_ms": ttft_ms,
        "latency_ms": latency_ms,
        "output_tokens": tokens,
        "eval_count": final.get("eval_count"),
        "eval_duration_ns": final.get("eval_duration"),
        "prompt_tokens": final.get("prompt_eval_count"),
        "tokens_per_second": tps,
        "error": None,
    }


class Run:
    def __init__(self, config, emitter):
        self.config = config
        self.emitter = emitter
        self.address = ollama_address(config["ollama_url"])
        self.records = []
        # Re-entrant: a checkpoint summarises the records while holding the lock.
        self.lock = threading.RLock()
        self.next_index = 0
        self.start = None

    def one_request(self, warmup):
        prompts = self.config["prompts"]
        with self.lock:
            index = self.next_index
            self.next_index += 1
        prompt_index = index % len(prompts)
        try:
            record = generate(
                self.address,
                self.config["model"],
                prompts[prompt_index],
                self.config["max_tokens"],
                self.config.get("request_timeout", 120),
            )
        except Exception as exc:  # every failure is a per-request error record
            record = {
                "started_at": time.time(),
                "ttft_ms": None,
                "latency_ms": 0.0,
                "output_tokens": 0,
                "eval_count": None,
                "eval_duration_ns": None,
                "prompt_tokens": None,
                "tokens_per_second": None,
                "error": f"{type(exc).__name__}: {exc}",
            }
        record.update(index=index, warmup=warmup, prompt_index=prompt_index)
        with self.lock:
            self.records.append(record)
            count = len(self.records)
        self.emitter.emit("request", **record)
        if count % self.config.get("checkpoint_every", 10) == 0:
            self.checkpoint("running")
        return record

    def measured(self):
        with self.lock:
            return [r for r in self.records if not r["warmup"]]

    def totals(self):
        measured = self.measured()
        ok = [r for r in measured if r["error"] is None]
        tokens = sum(r["output_tokens"] for r in ok)
        elapsed = time.perf_counter() - self.start if self.start else 0.0
        return {
            "requests": len(ok),
            "tokens": tokens,
            "tps": round(tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "errors": len(measured) - len(ok),
            "elapsed": round(elapsed, 3),
        }

    def checkpoint(self, status):
        path = self.config.get("checkpoint_path")
        if not path:
            return
        with self.lock:
            data = {
                "status": status,
                "model": self.config["model"],
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "results": list(self.records),
                "summary": self.totals() if self.start else None,
            }
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)

    def worker(self, deadline):
        while not STOP.is_set() and time.perf_counter() < deadline:
            self.one_request(warmup=False)

    def progress_loop(self, deadline):
        interval = self.config.get("progress_interval", 60)
        next_at = self.start + interval
        while not STOP.is_set() and next_at < deadline:
            if STOP.wait(max(0.0, next_at - time.perf_counter())):
                return
            self.emitter.emit("progress", **self.totals())
            next_at += interval

    def run(self):
        self.emitter.emit("connection", status="connected", url=self.config["ollama_url"])
        self.checkpoint("started")
        warmups = self.config.get("warmup_requests", 0)
        if warmups:
            self.emitter.emit("worker", status="warmup")
            for _ in range(warmups):
                if STOP.is_set():
                    break
                self.one_request(warmup=True)
        self.emitter.emit("worker", status="running")
        self.start = time.perf_counter()
        deadline = self.start + float(self.config["duration"])
        threads = [
            threading.Thread(target=self.worker, args=(deadline,), daemon=True)
            for _ in range(max(1, int(self.config.get("concurrency", 1))))
        ]
        reporter = threading.Thread(target=self.progress_loop, args=(deadline,), daemon=True)
        for thread in threads:
            thread.start()
        reporter.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
        STOP.set()
        duration = time.perf_counter() - self.start
        status = "interrupted" if getattr(self, "interrupted", False) else "completed"
        self.checkpoint(status)
        self.emitter.emit("progress", **self.totals())
        self.emitter.emit("finish", status=status, duration_seconds=duration, message="")


def main(argv):
    config = json.loads(argv[1])
    path = config.get("checkpoint_path")
    if path and not os.path.isabs(path):
        # Relative to the login home, whatever directory the SSH server started in.
        config["checkpoint_path"] = os.path.join(os.path.expanduser("~"), path)
    emitter = Emitter()
    run = Run(config, emitter)

    def interrupt(signum, frame):
        run.interrupted = True
        STOP.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    # A lost SSH connection must not kill the run: the checkpoint still fills.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        run.run()
    except Exception as exc:
        run.checkpoint("failed")
        emitter.emit("finish", status="failed", duration_seconds=0.0, message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
