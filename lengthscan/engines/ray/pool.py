"""The session's pool of worker actors: started once per Ray session, kept across splits and passes,
each call given to the actor with the fewest calls in flight, results taken in call order."""

from __future__ import annotations

from collections import deque

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
