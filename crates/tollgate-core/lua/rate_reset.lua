-- Resets a subject (an operator's action): deletes its quota keys
-- (KEYS[1..n-1]) and stamps the reset on KEYS[n] (the first quota key and
-- ':reset'): a settle of a charge taken at or before the stamp changes
-- nothing, as that charge was taken from a quota the reset gave back whole.
-- ARGV[1]: now in µs, or '' for the server's TIME (as the limiter's checks).
-- ARGV[2]: how long the stamp lives (ms): as long as a charge taken before
-- it may still be settled. The stamp and its TTL only move forward.
local now = ARGV[1] ~= '' and tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local n = #KEYS
if n > 1 then redis.call('DEL', unpack(KEYS, 1, n - 1)) end
local stamp = KEYS[n]
now = math.max(now, tonumber(redis.call('GET', stamp) or '0') or 0)
local ttl = math.max(ARGV[2] + 0, redis.call('PTTL', stamp))
redis.call('SET', stamp, string.format('%d', now), 'PX', ttl)
return 1
