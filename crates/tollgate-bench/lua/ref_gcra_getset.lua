-- Reference: a plain GCRA — GET the theoretical arrival time, SET it back with
-- PX — with floating-point arithmetic and tostring. Not tollgate's; for
-- comparison only. KEYS[1]: the key. ARGV[1]: burst. ARGV[2]: µs per request.
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
if allow_at > now then
  return {0, math.ceil(allow_at - now)}
end
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((now - allow_at) / interval)}
