"""Prefix affinity on Ray Serve's request-router extension point: a request with a prefix key goes
first to the replica that key hashes to (rendezvous hashing, so a replica that leaves or joins moves
only its own share of the keys), then to the least loaded of the others. Ray's base router picks
within each rank by the replicas' queue lengths and skips a full replica, so the fallback is Ray's."""
import hashlib

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

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
        home = max(candidate_replicas, key=lambda replica: _weight(key, replica))
        others = [replica for replica in candidate_replicas if replica is not home]
        if self._overloaded(home, others):
            return [others, [home]]
        return [[home], others]

    def _overloaded(self, home: RunningReplica, others: list[RunningReplica]) -> bool:
        """Whether home has imbalanced_threshold more requests than the least loaded other (as far as
        the router's cache of queue lengths knows)."""
        cache = self.replica_queue_len_cache
        home_len = cache.get(home.replica_id)
        other_lens = [n for n in (cache.get(r.replica_id) for r in others) if n is not None]
        return home_len is not None and bool(other_lens) and home_len - min(other_lens) > self.imbalanced_threshold


def _prefix_key(pending_request: PendingRequest | None) -> int | None:
    if pending_request is None or not pending_request.args:
        return None
    request = pending_request.args[0]
    return request.prefix_key if isinstance(request, ForwardedRequest) else None


def _weight(key: int, replica: RunningReplica) -> int:
    text = f"{key}:{replica.replica_id.unique_id}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")
