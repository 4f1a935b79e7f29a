-- Blocks a subject (an operator's action): KEYS[1], its block key, lives
-- for the block (check scripts read its PTTL); its value is the block's
-- end on the server's clock (µs), for a reader's information. KEYS[2] and
-- KEYS[3], on one server (never a cluster: they are the limiter's, not the
-- subject's): the limiter's block marker, a string that lives as long as
-- its longest block, and its block index, a sorted set of each block's end
-- under its subject's tag (the braces of its key) that lives as long; a
-- batch of many subjects reads the marker with its keys and the index only
-- while it exists, instead of a block key per check (rate_lean.lua).
-- ARGV[1]: the block's length in ms (> 0). ARGV[2]: '1' to block for at
-- least that long (a block that lasts longer stays: a later, shorter wait
-- an upstream asks for must not lift an earlier, longer one), else the
-- block replaces any earlier one. Returns the block in force, in ms left.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local ms, kept = ARGV[1] + 0, false
if ARGV[2] == '1' then
  local left = redis.call('PTTL', KEYS[1])
  if left >= ms then ms, kept = left, true end
end
local ends = now + ms * 1000
if not kept then
  redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', ARGV[1])
end
local marker, index = KEYS[2], KEYS[3]
if index then
  -- The block in force, even one kept from before the index was written.
  redis.call('ZADD', index, string.format('%d', ends), string.match(KEYS[1], '{[^}]*}'))
  redis.call('ZREMRANGEBYSCORE', index, '-inf', string.format('(%d', now))
  if redis.call('PTTL', index) < ms then
    redis.call('PEXPIRE', index, string.format('%d', ms))
  end
  if redis.call('PTTL', marker) < ms then
    redis.call('SET', marker, '1', 'PX', string.format('%d', ms))
  end
end
return ms
