-- Decides N checks of one limiter (one algorithm, one quota, no wait) in
-- one call: one TIME, one MGET, one EXISTS of the block index (or of the
-- block keys), one SET per admitted key (a key repeated in the batch: once,
-- at the end), one figure per check back. At most about 7000 checks per
-- call (unpack's limit on the values it returns). The loader puts before it
-- `local now, cost, n`, rate_prelude.lua and the algorithm's
-- `<alg>_lean.lua`, which reads the quota from ARGV[2], ARGV[3] and defines
-- `step(key, cost, state, keep, got)`: it decides one check from `state`
-- (nil: from `got`, what `key` stores) and returns the state it decided from (an integer
-- below 2^52, read as the single script reads it), the state after an
-- admission (nil: refused) and whether it stored it — it does unless `keep`
-- and the state reads back as written, and then a step of cost 0 from the
-- state stores it later: the state of a key repeated in the batch is kept
-- between its checks as a sequence of single calls would read it back, and
-- written once. The client derives the figures from the state.
-- KEYS: each check's key, in order, then, when ARGV[4] is '2', each one's
-- block key in the same order, or, when it is 'i' or 'u', the limiter's
-- block marker and block index (rate_block_set.lua: checks of many
-- subjects read the marker with their keys, not a block key each; 'u':
-- no key is checked twice in the call); or, when every check is of one
-- subject, its key (and block key) once.
-- ARGV[1]: now in µs, or '' for the server's TIME. ARGV[2], ARGV[3]: the
-- quota's two parameters, as a single call takes them. ARGV[4]: keys per
-- check ('i': one, and the index). ARGV[5]: the number of checks. ARGV[6]: every check's cost, or
-- each one's, 'c1,c2,…'. ARGV[7]: the earliest deadline (server µs) or '':
-- when now is past it, ARGV[8] holds each check's deadline, 'd1,d2,…' (0:
-- none), as rate_deadline.lua reads it.
-- Returns now, then per check: 2 × the state it decided from, + 1 when it
-- was admitted (the decision itself, never re-derived by the client);
-- 2^53 + 2 × the ms left when its subject is blocked; 2^54 when it came
-- after its deadline (it takes nothing). All as little-endian doubles in
-- one string: Redis packs it for less than it writes an array of integers,
-- and a client reads it once (redis-rs reads an array element by element).
now = ARGV[1] ~= '' and tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local count = ARGV[5] + 0
local unique = ARGV[4] == 'u'
local index = (unique or ARGV[4] == 'i') and KEYS[count + 2]
-- 0 when KEYS holds one subject's keys for every check, else 1: check c's
-- key is KEYS[at * (c - 1) + 1].
local at = (index or #KEYS >= count * ARGV[4]) and 1 or 0
local same, costs = tonumber(ARGV[6]), nil
if not same then
  costs = {}
  for c in string.gmatch(ARGV[6], '%d+') do costs[#costs + 1] = c + 0 end
end
-- Past the earliest deadline only: read which checks are late.
local late
if ARGV[7] ~= '' and now > ARGV[7] + 0 then
  late = {}
  for d in string.gmatch(ARGV[8], '%d+') do late[#late + 1] = d ~= '0' and now > d + 0 end
end
-- One MGET (with the block marker, if sent); a key repeated in the batch
-- (one hot subject among others) has its state kept in `held` between its
-- checks, and what it stores in `batch_view`. Keys the client says are
-- distinct need neither (a table of the batch costs Redis more than the
-- checks' arithmetic).
batch_view = {}
local last = at * (count - 1) + 1
-- KEYS is a global: read once (a lookup per use costs).
local keys = KEYS
local got = redis.call('MGET', unpack(keys, 1, index and last + 1 or last))
local held, dirty
if not unique then
  for i = 1, last do
    local key = keys[i]
    if not held and batch_view[key] ~= nil then held, dirty = {}, {} end
    batch_view[key] = got[i]
  end
end
if at == 0 and count > 1 then held, dirty = {}, {} end
-- A block key exists while its block lasts (rate_block_set.lua): one
-- EXISTS tells whether any check here may be blocked; only then is each
-- block key's PTTL read, the wait a single call reports (rate_block.lua).
-- The marker exists while any block of the limiter lasts; only then is
-- the index read, which holds each block's end (server µs) under its
-- subject's tag: its live blocks at once when they are no more than the
-- checks (a standing ban costs one call), else each check's.
local first = at * (count - 1) + 2
local blocks, server_now, ends_of
if index then
  if got[last + 1] then
    server_now = now
    if ARGV[1] ~= '' then
      local t = redis.call('TIME')
      server_now = t[1] * 1000000 + t[2]
    end
    local live = redis.call('ZRANGEBYSCORE', index, string.format('(%d', server_now), '+inf',
      'WITHSCORES', 'LIMIT', 0, count + 1)
    if #live <= 2 * count then
      ends_of = {}
      for j = 1, #live, 2 do ends_of[live[j]] = live[j + 1] end
    end
  end
else
  blocks = #KEYS >= first and redis.call('EXISTS', unpack(KEYS, first, #KEYS)) > 0
end
-- What refuses check c before its step: its deadline passed, or a block
-- (its figure, as below); nil when neither.
local function refused(c)
  if late and late[c] then return 18014398509481984 end
  local left = 0
  if server_now then
    local tag = string.match(KEYS[c], '{[^}]*}')
    local ends
    if not tag then
      ends = nil
    elseif ends_of then
      ends = ends_of[tag]
    else
      ends = redis.call('ZSCORE', index, tag)
    end
    if ends then left = math.ceil((ends - server_now) / 1000) end
  elseif blocks then
    left = redis.call('PTTL', KEYS[first + at * (c - 1)])
  end
  if left > 0 then return 9007199254740992 + 2 * math.min(left, 2251799813685247) end
end
local guarded, keep = late or server_now or blocks, held ~= nil
-- `out` sized once (each check's slot is filled below; the keys are
-- placeholders), not grown check by check.
local out = {now, unpack(keys, 1, count)}
local i = 1
for c = 1, count do
  local figure = guarded and refused(c)
  if not figure then
    local key = keys[i]
    local state, after, stored = step(key, same or costs[c], held and held[key], keep,
      unique and got[i] or batch_view[key])
    if keep then
      if after == nil then
        held[key] = state
      elseif stored then
        held[key], dirty[key] = nil, nil
      else
        held[key], dirty[key] = after, true
      end
    end
    figure = after and state * 2 + 1 or state * 2
  end
  out[c + 1] = figure
  i = i + at
end
-- A write that fails here fails the whole call: no check is answered as
-- admitted without its write.
if dirty then
  -- A step of cost 0 from a held state admits it and stores it as it is.
  for key in pairs(dirty) do step(key, 0, held[key], false) end
end
return struct.pack('<' .. string.rep('d', count + 1), unpack(out))
