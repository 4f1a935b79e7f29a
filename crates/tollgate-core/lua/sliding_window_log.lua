-- Sliding window log: a sorted set per key, one member per admitted unit,
-- scored by its time in µs. Exact; memory is bounded by the limit because a
-- denied request adds nothing.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS).
-- ARGV[3]: the check's id from the client (a per-process random base plus a
-- counter), making members unique; a refund removes the members it prefixes.
-- ARGV[2+2i], ARGV[3+2i]: limit and period (µs) of quota i.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after logging the cost when every quota admits it, else the
-- figures as they stand (nothing is added: all or nothing).

-- Logs `cost` members scored `score` under `key`: one per unit, in ZADD
-- chunks because unpack has a limit on how many values it returns.
local function log_units(key, score)
  if cost == 1 then
    -- The usual cost: no argument table, no unpack.
    redis.call('ZADD', key, score, ARGV[3] .. ':1')
    return
  end
  local m = 0
  while m < cost do
    local args, k = {}, 0
    while m < cost and k < 1000 do
      m, k = m + 1, k + 1
      args[2 * k - 1], args[2 * k] = score, ARGV[3] .. ':' .. m
    end
    redis.call('ZADD', key, unpack(args))
  end
end

-- Drops the entries of `key` scored at or before `upto`. A key of another
-- type (WRONGTYPE) is not a log: deleted, so it reads as an empty one and
-- is overwritten (see rate_prelude.lua).
local function trim(key, upto)
  if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', upto)) == 'table' then
    redis.call('DEL', key)
  end
end

-- Until the oldest entry of `key` leaves the window (more room is made
-- available then); 0 for an empty log. `count` entries are in it.
local function next_us(key, count, period)
  if count == 0 then return 0 end
  return redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] + period - now
end

if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables).
  local limit, period = ARGV[4] + 0, ARGV[5] + 0
  trim(KEYS[1], string.format('%d', now - period))
  local count = redis.call('ZCARD', KEYS[1])
  if count + cost > limit then
    local reset, idx = 0, count + cost - limit - 1
    if count > 0 then
      reset = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]) + period - now
    end
    -- No such entry when the cost exceeds the limit (it never fits): a period.
    local at = tonumber(redis.call('ZRANGE', KEYS[1], idx, idx, 'WITHSCORES')[2]) or now
    local retry = at + period - now
    return {0, now, limit - count, reset, retry, next_us(KEYS[1], count, period)}
  end
  -- The oldest entry, before logging: this request's own when the log was empty.
  local next = 0
  if count > 0 then next = next_us(KEYS[1], count, period) elseif cost > 0 then next = period end
  log_units(KEYS[1], string.format('%d', now))
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(period / 1000)))
  return {1, now, limit - count - cost, period, 0, next}
end
local count, limit, period, ok = {}, {}, {}, true
for i = 1, n do
  limit[i], period[i] = ARGV[2 + 2 * i] + 0, ARGV[3 + 2 * i] + 0
  -- Entries at or before now - period have left the window.
  trim(KEYS[i], string.format('%d', now - period[i]))
  count[i] = redis.call('ZCARD', KEYS[i])
  if count[i] + cost > limit[i] then ok = false end
end
local out = {ok and 1 or 0, now}
local score = string.format('%d', now)
for i = 1, n do
  local j = 4 * i - 1
  out[j + 3] = next_us(KEYS[i], count[i], period[i])
  if ok then
    if count[i] == 0 and cost > 0 then out[j + 3] = period[i] end
    log_units(KEYS[i], score)
    redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil(period[i] / 1000)))
    out[j], out[j + 1], out[j + 2] = limit[i] - count[i] - cost, period[i], 0
  else
    local reset, retry = 0, 0
    if count[i] > 0 then
      reset = tonumber(redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2]) + period[i] - now
    end
    if count[i] + cost > limit[i] then
      -- The entry whose expiry frees enough room for this cost (none when
      -- the cost exceeds the limit: it never fits; a period).
      local idx = count[i] + cost - limit[i] - 1
      local at = tonumber(redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')[2]) or now
      retry = at + period[i] - now
    end
    out[j], out[j + 1], out[j + 2] = limit[i] - count[i], reset, retry
  end
end
return out
