-- Token bucket in one integer per key: the instant (µs) at which the bucket was
-- last empty. tokens(now) = min(capacity, floor((now - empty_at) / interval)).
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost. ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: capacity and refill interval per token (µs) of quota i.
-- Returns {allowed, then per quota: remaining, reset_after_us, retry_after_us}.
-- All-or-nothing: nothing is written unless every quota has the tokens.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local out, new, ok = {1}, {}, true
for i = 1, #KEYS do
  local capacity, interval = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local full = capacity * interval
  local empty_at = tonumber(redis.call('GET', KEYS[i])) or (now - full)
  -- A full bucket holds no more than its capacity.
  if empty_at < now - full then empty_at = now - full end
  local tokens = math.floor((now - empty_at) / interval)
  local after = empty_at + cost * interval
  local j = 3 * i - 1
  if tokens < cost then
    ok = false
    out[j], out[j + 1], out[j + 2] = tokens, empty_at + full - now, after - now
  else
    new[i] = after
    out[j], out[j + 1], out[j + 2] = tokens - cost, after + full - now, 0
  end
end
if ok then
  for i = 1, #KEYS do
    -- The key is worthless once the bucket is full again: expire it then.
    redis.call('SET', KEYS[i], string.format('%d', new[i]), 'PX',
      math.ceil((new[i] + tonumber(ARGV[2 + 2 * i]) * tonumber(ARGV[3 + 2 * i]) - now) / 1000))
  end
else
  out[1] = 0
end
return out
