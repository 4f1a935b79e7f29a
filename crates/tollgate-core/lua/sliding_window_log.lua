-- Sliding window log: a sorted set per key, one member per admitted unit,
-- scored by its time in µs. Exact; memory is bounded by the limit because a
-- denied request adds nothing.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost.
-- ARGV[3]: a random nonce from the client, making members unique.
-- ARGV[2+2i], ARGV[3+2i]: limit and period (µs) of quota i.
-- Returns {allowed, then per quota: remaining, reset_after_us, retry_after_us}.
-- All-or-nothing: nothing is added unless every quota admits the cost.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local out, ok = {1}, true
for i = 1, #KEYS do
  local limit, period = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  -- Entries at or before now - period have left the window.
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - period))
  local count = redis.call('ZCARD', KEYS[i])
  local j = 3 * i - 1
  if count + cost > limit then
    ok = false
    -- The entry whose expiry frees enough room for this cost.
    local idx = count + cost - limit - 1
    local freeing = redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')
    local newest = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    out[j], out[j + 1], out[j + 2] = limit - count, tonumber(newest[2]) + period - now,
      tonumber(freeing[2]) + period - now
  else
    out[j], out[j + 1], out[j + 2] = limit - count - cost, period, 0
  end
end
if ok then
  local score = string.format('%d', now)
  for i = 1, #KEYS do
    local n = 0
    while n < cost do
      -- ZADD in chunks: unpack has a limit on how many values it returns.
      local args, m = {}, 0
      while n < cost and m < 1000 do
        n, m = n + 1, m + 1
        args[2 * m - 1], args[2 * m] = score, ARGV[3] .. ':' .. n
      end
      redis.call('ZADD', KEYS[i], unpack(args))
    end
    redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(ARGV[3 + 2 * i]) / 1000))
  end
else
  out[1] = 0
end
return out
