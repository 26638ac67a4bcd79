"""The tests' real ``redis-server`` (``pdserve.local_redis``, the one ``pdserve serve --redis
auto`` runs)."""

from pdserve.local_redis import RedisServer, redis_server

__all__ = ["RedisServer", "redis_server"]
