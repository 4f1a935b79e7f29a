-- Claim an idempotency key: replay its completed record, report it in
-- flight, or take its lease (a lock, fenced) and record the payload.
-- KEYS[1]: the lease's lock key. KEYS[2]: its fence key. KEYS[3]: the
-- record (a hash: s = state 'f' in flight / 'd' done, p = fingerprint,
-- f = fence, a = when claimed (µs, the server's clock: for the operator's
-- listing), c = status, h = headers, b = body, r = '1' when replayable).
-- All share the key's hash tag.
-- ARGV[1]: the owner token. ARGV[2]: the lease TTL in ms. ARGV[3]: the
-- fence key's TTL in ms. ARGV[4]: the record's TTL in ms. ARGV[5]: the
-- request's fingerprint (hex).
-- Returns {2, same, status, headers, body, replayable} for a completed
-- record, {1, fence} when claimed, {0, same, pttl_ms} while another holder
-- has it in flight. `same` is 1 when the stored fingerprint is this one's.
local rec = redis.call('HMGET', KEYS[3], 's', 'p', 'c', 'h', 'b', 'r')
local same = 0
if not rec[2] or rec[2] == ARGV[5] then same = 1 end
if rec[1] == 'd' then
  return {2, same, rec[3], rec[4], rec[5], rec[6]}
end

local function claim(prev)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local fence = now
  if prev + 1 > fence then fence = prev + 1 end
  fence = string.format('%d', fence)
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
  -- A record left in flight by a holder whose lease ran out is replaced.
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 's', 'f', 'p', ARGV[5], 'f', fence, 'a',
    string.format('%d', now))
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  return {1, fence + 0}
end

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return claim(tonumber(redis.call('GET', KEYS[2]) or '0') or 0)
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- A retried claim (after a connection error) finds its own lease.
  local fence = tonumber(redis.call('HGET', KEYS[3], 'f') or '')
  if fence then return {1, fence} end
  return claim(tonumber(redis.call('GET', KEYS[2]) or '0') or 0)
end
return {0, same, redis.call('PTTL', KEYS[1])}
