"""A run's pool of worker actors: started once per run (or kept between runs, below), kept across splits and passes,
each call given to the actor with the fewest calls in flight, results taken in call order.

Inside ``keep_actors()`` (``lengthscan.keep_ray_actors``), a run on a Ray this process joined
(``ray.init`` called before: a notebook, a test session) leaves its pool started when it ended
well: the next run finds its actors up, their modules imported and the tokenizer's module loaded
(``kept_pool``, ``keep_pool``); leaving the block kills them. Outside it (the default) and after
a run that failed (an actor may be stuck in a user's template), the actors are killed at the end of
the run: kept actors hold their CPUs, which other Ray work on the cluster would wait for."""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager

#: Calls in flight per actor (one running, one queued: an actor never waits for its next task).
IN_FLIGHT = 2


def pool_size(ray) -> int:
    """Actors a pool has: one per CPU of the cluster (they read their rows themselves)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class ActorPool:
    """``size`` actors of ``cls``, each restarted by Ray when its process dies and its unfinished
    calls retried (every call is a pure function of its arguments). Each holds one CPU."""

    def __init__(self, ray, cls, size: int | None = None):
        self.ray = ray
        cpus = 1 if ray.cluster_resources().get("CPU", 1) >= 1 else 0
        actor_cls = ray.remote(num_cpus=cpus, max_restarts=-1, max_task_retries=-1)(cls)
        self.actors = [actor_cls.remote() for _ in range(size or pool_size(ray))]

    def __len__(self) -> int:
        return len(self.actors)

    def ordered(self, calls):
        """The results of ``calls`` ((method name, args) ...), in order; at most ``IN_FLIGHT`` calls
        per actor at a time, each to the least busy one. Calls left when the consumer stops (an
        error) are cancelled, not retried on a killed actor."""
        ray = self.ray
        busy = [0] * len(self.actors)
        pending: deque = deque()
        try:
            for name, args in calls:
                while len(pending) >= IN_FLIGHT * len(self.actors):
                    who, ref = pending.popleft()
                    result = ray.get(ref)
                    busy[who] -= 1
                    yield result
                who = min(range(len(self.actors)), key=busy.__getitem__)
                busy[who] += 1
                pending.append((who, getattr(self.actors[who], name).remote(*args)))
            while pending:
                who, ref = pending.popleft()
                result = ray.get(ref)
                busy[who] -= 1
                yield result
        finally:
            for _, ref in pending:
                ray.cancel(ref)

    def each(self, name: str, *args) -> list:
        """``name`` called once on every actor; their answers."""
        return self.ray.get([getattr(a, name).remote(*args) for a in self.actors])

    def first(self, name: str, *args):
        return self.ray.get(getattr(self.actors[0], name).remote(*args))

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


#: pools of joined Ray sessions, waiting for the next run: (job id, worker class, size) -> pool
_waiting: dict = {}
#: how many ``keep_actors`` blocks are open
_keeping = [0]


@contextmanager
def keep_actors():
    """Runs on a joined Ray keep their worker actors for the next run until the block ends (a
    notebook's or a test session's series of ``audit_ray`` calls pays the actors' start once).
    While kept, the actors hold one CPU each."""
    _keeping[0] += 1
    try:
        yield
    finally:
        _keeping[0] -= 1
        if not _keeping[0]:
            release_actors()


def keeping() -> bool:
    return _keeping[0] > 0


def release_actors() -> None:
    """Kill the kept actors (their CPUs free for other Ray work)."""
    while _waiting:
        _, pool = _waiting.popitem()
        try:
            pool.close()
        except Exception:  # a Ray since shut down took its actors with it
            pass


def _key(ray, cls) -> tuple:
    return ray.get_runtime_context().get_job_id(), cls, pool_size(ray)


def kept_pool(ray, cls) -> ActorPool | None:
    """The pool a previous run on this Ray session kept (None: none)."""
    key = _key(ray, cls)
    for stale in [k for k in _waiting if k[0] != key[0]]:  # a Ray session since shut down: its actors are gone
        del _waiting[stale]
    return _waiting.pop(key, None)


def keep_pool(ray, cls, pool: ActorPool) -> None:
    """``pool`` kept for the next run on this session, its actors emptied of this run's objects."""
    pool.each("forget")
    _waiting[_key(ray, cls)] = pool
