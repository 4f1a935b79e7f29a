-- Fixed window aligned to the epoch: one string per key, "<window index>:<count>".
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
  local count = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local sep = string.find(v, ':', 1, true)
    -- A count from an earlier window no longer counts.
    if tonumber(string.sub(v, 1, sep - 1)) == w then count = tonumber(string.sub(v, sep + 1)) end
  end
  local reset = (w + 1) * period - now
  local j = 3 * i - 1
  if count + cost > limit then
    ok = false
    out[j], out[j + 1], out[j + 2] = limit - count, reset, reset
  else
    new[i], ttl[i] = string.format('%d:%d', w, count + cost), math.ceil(reset / 1000)
    out[j], out[j + 1], out[j + 2] = limit - count - cost, reset, 0
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
