-- Reference: the common token bucket found in blog posts and libraries — a
-- hash {tokens, ts} read with HMGET, written with HSET and PEXPIRE, with
-- floating-point refill. Not tollgate's; for comparison only.
-- KEYS[1]: the bucket. ARGV[1]: capacity. ARGV[2]: µs per token.
local capacity = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or capacity
local ts = tonumber(v[2]) or now
tokens = math.min(capacity, tokens + (now - ts) / interval)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * interval / 1000))
return {allowed, math.floor(tokens)}
