"""Worker processes that run pickled calls: plain Python processes (``subprocess``) reading jobs
from a pipe and writing their results to another.

Not ``multiprocessing``: its spawned workers bring a resource-tracker process (about 13 MB) and
import the parent's main module, and a worker the kernel kills (out of memory) leaves
``Pool``'s caller waiting for ever. Here a worker that dies fails its jobs with a message naming its
exit status, and the processes hold only what their jobs import.

A job is ``(function, args)``, pickled; its answer is ``(True, result)`` or ``(False, exception)``,
raised again by ``Future.result()`` in the parent. Each worker has a writer thread (a job waits in
the parent's queue, not in a blocked write, while the worker is busy) and a reader thread.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future
from queue import SimpleQueue

_HEADER = struct.Struct("<Q")
#: seconds a worker is given to end once its pipe is closed, before it is killed
STOP_SECONDS = 5.0


class WorkerDied(RuntimeError):
    """A worker process ended before it answered."""


class Workers:
    """``processes`` worker processes, each first calling ``init(*init_args)``; ``submit`` hands a
    job to the worker with the fewest waiting. A context manager: leaving it stops them."""

    def __init__(self, processes: int, init=None, init_args: tuple = ()):
        self._workers: list[_Worker] = []
        try:
            for _ in range(max(1, processes)):
                self._workers.append(_Worker(init, init_args))
        except BaseException:  # one did not start (OSError): those that did are stopped
            self.close(kill=True)
            raise

    def submit(self, fn, *args) -> Future:
        worker = min(self._workers, key=lambda w: w.waiting)
        return worker.submit(fn, args)

    def close(self, *, kill: bool = False) -> None:
        """Stop the workers: once their jobs are done, or at once (``kill``)."""
        for w in self._workers:
            w.close()
        for w in self._workers:
            w.wait(STOP_SECONDS if not kill else 0)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(kill=kind is not None)


class _Worker:
    def __init__(self, init, init_args: tuple):
        import lengthscan

        home = os.path.dirname(os.path.dirname(os.path.abspath(lengthscan.__file__)))  # this lengthscan, first
        code = (f"import sys; {home!r} in sys.path or sys.path.insert(0, {home!r}); "
                "from lengthscan.engines.procs import serve; serve()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     close_fds=True)
        self.waiting = 0  # jobs submitted and not answered
        self._sent: deque[Future] = deque()  # the futures of the jobs written, in order
        self._lock = threading.Lock()
        self._jobs: SimpleQueue = SimpleQueue()
        self._closed = False
        self._ended: str | None = None  # how the process ended, where it ended by itself
        threading.Thread(target=self._write, name="lengthscan-worker-write", daemon=True).start()
        threading.Thread(target=self._read, name="lengthscan-worker-read", daemon=True).start()
        if init is not None:
            self.submit(init, init_args)

    def submit(self, fn, args: tuple) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:  # a job given after the process ended is told why it ended
                raise WorkerDied(self._ended or "the worker processes were stopped")
            self.waiting += 1
        future.add_done_callback(self._answered)
        self._jobs.put((future, fn, args))
        return future

    def _answered(self, future: Future) -> None:
        with self._lock:
            self.waiting -= 1

    def _write(self) -> None:
        pipe = self.proc.stdin
        while True:
            job = self._jobs.get()
            if job is None:
                break
            future, fn, args = job
            try:
                data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - a job that does not pickle: its own error
                future.set_exception(exc)
                continue
            with self._lock:
                gone = self._closed and self.proc.poll() is not None
                if not gone:
                    self._sent.append(future)
            if gone:
                future.set_exception(WorkerDied("a worker process ended before it was given a job"))
                continue
            try:
                _send(pipe, data)
            except OSError:
                pass  # the worker is gone: the reader fails what it was sent
        try:
            pipe.close()
        except OSError:
            pass

    def _read(self) -> None:
        pipe = self.proc.stdout
        while (data := _receive(pipe)) is not None:
            try:
                ok, value = pickle.loads(data)
            except Exception as exc:  # noqa: BLE001 - an answer that does not unpickle here
                ok, value = False, exc
            with self._lock:
                future = self._sent.popleft() if self._sent else None
            if future is not None:
                future.set_result(value) if ok else future.set_exception(value)
        pipe.close()
        code = self.proc.wait()
        ended = f"a worker process ended (exit status {code}) before it answered"
        with self._lock:
            self._ended = None if self._closed else ended
            self._closed = True
            left = list(self._sent)
            self._sent.clear()
        for future in left:
            future.set_exception(WorkerDied(ended))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._jobs.put(None)

    def wait(self, seconds: float) -> None:
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _send(pipe, data: bytes) -> None:
    """One message: its length, then its bytes."""
    pipe.write(_HEADER.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _receive(pipe) -> bytes | None:
    """One message ``_send`` wrote; None where the pipe ends first."""
    header = _read_exactly(pipe, _HEADER.size)
    return None if header is None else _read_exactly(pipe, _HEADER.unpack(header)[0])


def _read_exactly(pipe, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = pipe.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve() -> None:
    """A worker process's loop: jobs from stdin, answers to stdout (what the jobs print goes to
    stderr), until stdin closes. Ctrl-C is left to the parent."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jobs = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while (data := _receive(jobs)) is not None:
        try:
            fn, args = pickle.loads(data)
            answer = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - sent back, raised in the parent
            answer = (False, exc)
        try:
            out = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
            if not answer[0]:
                pickle.loads(out)  # an exception that pickles but does not unpickle (its __init__ wants more)
        except Exception as exc:  # noqa: BLE001 - an answer that does not (un)pickle: said as text
            out = pickle.dumps((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}"
                                                    if not answer[0] else f"an answer that does not pickle: {exc}")))
        _send(answers, out)
