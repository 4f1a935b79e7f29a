-- Sliding window counter: one string per key, "<window>:<previous count>:<current count>".
-- The estimate weights the previous window by how much of it still overlaps
-- the sliding window: ceil(previous * (period - elapsed) / period) + current.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost. ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: limit and period (µs) of quota i.
-- Returns {allowed, then per quota: remaining, reset_after_us, retry_after_us}.
-- All-or-nothing: nothing is written unless every quota admits the cost.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local out, new, ttl, ok = {1}, {}, {}, true
for i = 1, #KEYS do
  local limit, period = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local w = math.floor(now / period)
  local e = now - w * period
  local prev, cur = 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local a = string.find(v, ':', 1, true)
    local b = string.find(v, ':', a + 1, true)
    local sw = tonumber(string.sub(v, 1, a - 1))
    if sw == w then
      prev, cur = tonumber(string.sub(v, a + 1, b - 1)), tonumber(string.sub(v, b + 1))
    elseif sw == w - 1 then
      prev = tonumber(string.sub(v, b + 1))
    end
  end
  local est = cur + math.floor((prev * (period - e) + period - 1) / period)
  local j = 3 * i - 1
  if est + cost > limit then
    ok = false
    local retry
    if cur + cost <= limit then
      -- Later in this window, once the previous window's weight has dropped.
      retry = period - math.floor((limit - cur - cost) * period / prev) - e
    else
      -- In the next window, once this window's weight has dropped.
      retry = period - e + period - math.floor((limit - cost) * period / cur)
    end
    local reset = period - e
    if cur > 0 then reset = reset + period end
    out[j], out[j + 1], out[j + 2] = math.max(limit - est, 0), reset, retry
  else
    new[i], ttl[i] = string.format('%d:%d:%d', w, prev, cur + cost), math.ceil((2 * period - e) / 1000)
    out[j], out[j + 1], out[j + 2] = limit - est - cost, 2 * period - e, 0
  end
end
if ok then
  for i = 1, #KEYS do
    redis.call('SET', KEYS[i], new[i], 'PX', ttl[i])
  end
else
  out[1] = 0
end
return out
