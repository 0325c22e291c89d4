"""Prefix affinity on Ray Serve's request-router extension point: a request with a prefix key goes
first to the replica that key hashes to (rendezvous hashing, so a replica that leaves or joins moves
only its own share of the keys), then to the least loaded of the others. Ray's base router picks
within each rank by the replicas' queue lengths and skips a full replica, so the fallback is Ray's."""
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from gdserve.entrypoints.ray_serve.affinity import home as home_of
from gdserve.entrypoints.ray_serve.affinity import overloaded
from gdserve.entrypoints.ray_serve.flags import DEFAULT_IMBALANCED_THRESHOLD
from gdserve.entrypoints.ray_serve.forward import ForwardedRequest


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, imbalanced_threshold: int = DEFAULT_IMBALANCED_THRESHOLD) -> None:
        self.imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key = _prefix_key(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        home = candidate_replicas[home_of(key, [replica.replica_id.unique_id for replica in candidate_replicas])]
        others = [replica for replica in candidate_replicas if replica is not home]
        if self._overloaded(home, others):
            return [others, [home]]
        return [[home], others]

    def _overloaded(self, home: RunningReplica, others: list[RunningReplica]) -> bool:
        """Whether home has imbalanced_threshold more requests than the least loaded other (as far as
        the router's cache of queue lengths knows)."""
        cache = self.replica_queue_len_cache
        other_lens = [n for n in (cache.get(r.replica_id) for r in others) if n is not None]
        return overloaded(cache.get(home.replica_id), other_lens, self.imbalanced_threshold)


def _prefix_key(pending_request: PendingRequest | None) -> int | None:
    if pending_request is None or not pending_request.args:
        return None
    request = pending_request.args[0]
    return request.prefix_key if isinstance(request, ForwardedRequest) else None
