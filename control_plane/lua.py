"""The control plane's Lua scripts: each write a worker makes is checked against its epoch in
the same atomic step, so a process fenced by a newer registration of its id cannot change
anything (heartbeats, load, KV events, state, unregistering).

Times are Redis's own clock (``TIME``), in ms, so hosts with skewed clocks agree.
Return codes shared by the fenced scripts: 0 ok, -1 the record is gone (lease expired or Redis
lost it: register again), -2 fenced (another registration of this id is newer).
"""

from __future__ import annotations

OK, GONE, FENCED = 0, -1, -2

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_FENCE = """
local cur = redis.call('HGET', KEYS[1], 'epoch')
if not cur then return {-1, now} end
if tonumber(cur) ~= tonumber(ARGV[1]) then return {-2, now} end
"""

# KEYS: epoch, worker, members, events.
# ARGV: worker id, lease ms, events maxlen, the caller's last epoch (0: none), field pairs...
# The epoch never goes below the caller's last one, so a process that registers again after
# Redis lost its counters (a restart without persistence) still outranks its own past.
REGISTER = (
    _NOW
    + """
local epoch = redis.call('INCR', KEYS[1])
if epoch <= tonumber(ARGV[4]) then
  epoch = tonumber(ARGV[4]) + 1
  redis.call('SET', KEYS[1], epoch)
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'epoch', epoch, unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
           'type', 'join', 'worker_id', ARGV[1], 'epoch', epoch)
return {epoch, now}
"""
)

# KEYS: worker, members, load. ARGV: epoch, worker id, lease ms, load field pairs (may be none).
HEARTBEAT = (
    _NOW
    + _FENCE
    + """
local lease = tonumber(ARGV[3])
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('ZADD', KEYS[2], now + lease, ARGV[2])
if #ARGV > 3 then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'timestamp_ms', now, unpack(ARGV, 4))
  redis.call('PEXPIRE', KEYS[3], lease)
end
return {0, now}
"""
)

# KEYS: worker, events. ARGV: epoch, worker id, state, events maxlen.
SET_STATE = (
    _NOW
    + _FENCE
    + """
redis.call('HSET', KEYS[1], 'state', ARGV[3])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
           'type', ARGV[3], 'worker_id', ARGV[2], 'epoch', ARGV[1])
return {0, now}
"""
)

# KEYS: worker, members, events, load. ARGV: epoch, worker id, events maxlen.
UNREGISTER = (
    _NOW
    + _FENCE
    + """
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*',
           'type', 'leave', 'worker_id', ARGV[2], 'epoch', ARGV[1])
return {0, now}
"""
)

# KEYS: worker, kv stream. ARGV: epoch, stream maxlen, first seq, last seq, payload.
PUBLISH_KV = (
    _NOW
    + _FENCE
    + """
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
           'gen', ARGV[1], 'first', ARGV[3], 'last', ARGV[4], 'events', ARGV[5])
return {0, now}
"""
)

# Atomic select-and-reserve over candidate workers, cheapest first after counting what every
# router has sent each one since its last load report.
# A send counts against a worker until a load report at least `visible` ms newer than it
# arrives (by then the worker has seen the request), or until it expires.
# KEYS: per candidate i: load_i, pending_i, pending_blocks_i.
# ARGV: request id, blocks needed, pending ttl ms, pending weight, visible ms, then per
# candidate: its cost.
# Returns {chosen index (1-based) or 0, pending blocks of candidate 1, of candidate 2, ...}.
SELECT_AND_RESERVE = (
    _NOW
    + """
local rid, need, ttl, weight = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local visible = tonumber(ARGV[5])
local n = #KEYS / 3
local best, best_cost = 0, nil
local out = {0}
for i = 1, n do
  local lk, pk, bk = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local old = redis.call('ZRANGEBYSCORE', pk, '-inf', now - ttl)
  if #old > 0 then
    redis.call('ZREM', pk, unpack(old))
    redis.call('HDEL', bk, unpack(old))
  end
  local report = redis.call('HMGET', lk, 'timestamp_ms', 'num_free_blocks')
  local seen = tonumber(report[1] or '0') - visible
  local since = redis.call('ZRANGEBYSCORE', pk, '(' .. seen, '+inf')
  local pend = 0
  if #since > 0 then
    for _, b in ipairs(redis.call('HMGET', bk, unpack(since))) do
      pend = pend + tonumber(b or '0')
    end
  end
  out[i + 1] = pend
  local free = tonumber(report[2] or '-1')
  if free < 0 or free - pend >= need then
    local cost = tonumber(ARGV[5 + i]) + weight * pend
    if best_cost == nil or cost < best_cost then best, best_cost = i, cost end
  end
end
if best > 0 then
  local pk, bk = KEYS[3 * best - 1], KEYS[3 * best]
  redis.call('ZADD', pk, now, rid)
  redis.call('HSET', bk, rid, need)
  redis.call('PEXPIRE', pk, ttl * 4)
  redis.call('PEXPIRE', bk, ttl * 4)
end
out[1] = best
return out
"""
)

# KEYS: pending, pending_blocks. ARGV: request id.
RELEASE_PENDING = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 0
"""
