-- Take `weight` of a semaphore's `limit` permits, fenced.
-- KEYS[1]: the holders (sorted set: member = owner token, or token#i for the
-- i-th of several permits; score = expiry in server µs). KEYS[2]: the fence
-- key. KEYS[3]: the holder's description (`<KEYS[1]>:holder:<token>`).
-- Fair names also pass KEYS[4], the queue (member = waiter ticket, score =
-- arrival in server µs), and KEYS[5], the tickets (score = the ticket's
-- expiry in server µs). All share the name's hash tag.
-- ARGV[1]: owner token (128-bit, hex). ARGV[2]: weight. ARGV[3]: limit.
-- ARGV[4]: the permit's TTL in ms. ARGV[5]: the fence key's TTL in ms.
-- ARGV[6]: who acquires (`host:pid`).
-- Fair names: ARGV[7]: the waiter's ticket ('' when it does not queue: a
-- try), ARGV[8]: the ticket's TTL in ms, ARGV[9]: the release channel.
-- Returns {1, fence} when taken, or {0, ms} when not: ms until enough
-- permits expire, or -1 when unknown (waiting behind others in the queue).
--
-- A holder that died is forgotten when its expiry passes: expired members go
-- before every decision, so nothing else has to clean up. The fence follows
-- the lock's rule, max(previous + 1, server time in µs).
-- Idempotent: a retried attempt (same token) finds its own permits and gets
-- them back with a fresh, higher fence; nothing is counted twice.
--
-- Each holder's description, `fence|since_ms|weight|holder`, lives in
-- KEYS[3] exactly as long as its permits (the same TTL, renewed with them by
-- permit_extend.lua, deleted by permit_release.lua), so an operator's
-- listing needs nothing but the store, and a holder that died leaves nothing.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local weight = ARGV[2] + 0
local ttl = ARGV[4] + 0
local fair = KEYS[4] ~= nil
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local function member(i)
  if weight == 1 then return ARGV[1] end
  return ARGV[1] .. '#' .. i
end

local function wait_ms(need)
  -- ms until `need` more permits are free: the need-th earliest expiry.
  local at = redis.call('ZRANGE', KEYS[1], need - 1, need - 1, 'WITHSCORES')[2]
  if not at then return -1 end
  return math.ceil((at - now) / 1000)
end

local function mine()
  return redis.call('ZSCORE', KEYS[1], member(1))
end

local ticket = fair and ARGV[7] or ''
if fair then
  if not mine() then
    local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
    for i = 1, #dead do
      redis.call('ZREM', KEYS[4], dead[i])
      redis.call('ZREM', KEYS[5], dead[i])
    end
    -- A head whose ticket is gone (evicted under memory pressure) would
    -- hold up the queue for as long as new waiters keep it alive: it goes.
    while true do
      local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
      if not head or redis.call('ZSCORE', KEYS[5], head) then break end
      redis.call('ZREM', KEYS[4], head)
    end
    if ticket ~= '' then
      local tttl = ARGV[8] + 0
      redis.call('ZADD', KEYS[4], 'NX', now, ticket)
      redis.call('ZADD', KEYS[5], now + tttl * 1000, ticket)
      -- The queue lives as long as its longest-lived ticket: a waiter with
      -- a shorter TTL (another poll interval) must not cut it short.
      for k = 4, 5 do
        if redis.call('PTTL', KEYS[k]) < tttl then
          redis.call('PEXPIRE', KEYS[k], ARGV[8])
        end
      end
      if redis.call('ZRANGE', KEYS[4], 0, 0)[1] ~= ticket then return {0, -1} end
    elseif redis.call('ZCARD', KEYS[4]) > 0 then
      return {0, -1}
    end
    local free = (ARGV[3] + 0) - redis.call('ZCARD', KEYS[1])
    if free < weight then return {0, wait_ms(weight - free)} end
  end
else
  -- Capacity first: a holder retrying its own attempt (same token) is only
  -- looked up when it would otherwise be refused; re-adding its members
  -- counts nothing twice.
  local free = (ARGV[3] + 0) - redis.call('ZCARD', KEYS[1])
  if free < weight and not mine() then return {0, wait_ms(weight - free)} end
end

local expiry = now + ttl * 1000
for i = 1, weight do
  redis.call('ZADD', KEYS[1], expiry, member(i))
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
if ticket ~= '' then
  redis.call('ZREM', KEYS[4], ticket)
  redis.call('ZREM', KEYS[5], ticket)
end
if fair and redis.call('ZCARD', KEYS[4]) > 0
    and redis.call('ZCARD', KEYS[1]) < ARGV[3] + 0 then
  -- Permits are left: wake the next in line now rather than at its poll.
  redis.call('PUBLISH', ARGV[9], 'next')
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
fence = fence + 1
if now > fence then fence = now end
fence = string.format('%d', fence)
redis.call('SET', KEYS[2], fence, 'PX', ARGV[5])
redis.call('SET', KEYS[3],
  fence .. '|' .. string.format('%d', math.floor(now / 1000)) .. '|' .. weight .. '|' .. ARGV[6],
  'PX', ARGV[4])
return {1, tonumber(fence)}
