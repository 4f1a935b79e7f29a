-- EXPERIMENT (not tollgate's script): token_bucket.lua's single-quota case as
-- straight-line code with locals — no per-quota tables, no loops. Same
-- arguments, same reply, same writes as token_bucket.lua with one key.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = tonumber(ARGV[2])
local interval = tonumber(ARGV[5])
local full = ARGV[4] * interval
local e = tonumber(redis.call('GET', KEYS[1])) or (now - full)
if e < now - full then e = now - full end
local tokens = math.floor((now - e) / interval)
local after = e + cost * interval
if tokens < cost then
  return {0, tokens, e + full - now, math.max(after - now, 0)}
end
redis.call('SET', KEYS[1], string.format('%d', after), 'PX', math.ceil((after + full - now) / 1000))
return {1, tokens - cost, after + full - now, 0}
