-- Who holds one lock or one semaphore name now (read-only): what an
-- operator's listing shows. Owner tokens never leave the script: they are
-- the holders' bearer secrets.
-- KEYS[1]: the lock key, or a semaphore's holders (sorted set). KEYS[2]: its
-- fence key. A holder's description key (`<KEYS[1]>:holder:<token>`, see
-- permit_acquire.lua) is read beside them: it shares their hash tag.
-- Returns {0} when nothing holds it; for a lock, {1, now_us, description,
-- pttl_ms, fence} (the description is what follows the token in the lock's
-- value, '' when there is none; the fence key's value, '' when gone); for
-- permits, {2, now_us, description, expiry_us, …} per live holder that has
-- a description.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
  local v = redis.call('GET', KEYS[1])
  local described = string.match(v, '^[^|]*|(.*)$') or ''
  return {1, now, described, redis.call('PTTL', KEYS[1]),
    redis.call('GET', KEYS[2]) or ''}
end
if kind ~= 'zset' then return {0} end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf',
  'WITHSCORES')
local out = {2, now}
local seen = {}
for i = 1, #live, 2 do
  local token = string.match(live[i], '^(.*)#%d+$') or live[i]
  if not seen[token] then
    seen[token] = true
    local description = redis.call('GET', KEYS[1] .. ':holder:' .. token)
    if description then
      out[#out + 1] = description
      out[#out + 1] = tonumber(live[i + 1])
    end
  end
end
return out
