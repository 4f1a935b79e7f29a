-- Decides N checks of one limiter (one algorithm, one quota, no wait) in
-- one call: one TIME, one MGET, one SET per admitted key, one figure per
-- check back. The loader puts before it `local now, cost, n`,
-- rate_prelude.lua and the algorithm's `<alg>_lean.lua`, which reads the
-- quota from ARGV[2], ARGV[3] and defines `step(key, cost)`: it decides one
-- check, stores what it admitted (via `store`) and returns the state it
-- decided from; the client derives the figures from that state.
-- KEYS: per check its key, then its block key when ARGV[4] is '2'.
-- ARGV[1]: now in µs, or '' for the server's TIME. ARGV[2], ARGV[3]: the
-- quota's two parameters, as a single call takes them. ARGV[4]: keys per
-- check. ARGV[5]: every check's cost, or each one's, 'c1,c2,…'. ARGV[6]: the
-- earliest deadline (server µs) or '': when now is past it, ARGV[7] holds
-- each check's deadline, 'd1,d2,…' (0: none), as rate_deadline.lua reads it.
-- Returns {now, then per check: the state it decided from, {} when it came
-- after its deadline (it takes nothing), {µs left} when its subject is blocked}.
now = ARGV[1] ~= '' and tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local stride = ARGV[4] + 0
local count = #KEYS / stride
local same, costs = tonumber(ARGV[5]), nil
if not same then
  costs = {}
  for c in string.gmatch(ARGV[5], '%d+') do costs[#costs + 1] = c + 0 end
end
-- Past the earliest deadline only: read which checks are late.
local late
if ARGV[6] ~= '' and now > ARGV[6] + 0 then
  late = {}
  for d in string.gmatch(ARGV[7], '%d+') do late[#late + 1] = d ~= '0' and now > d + 0 end
end
batch_view, batch_writes = {}, {}
local values = {}
-- In slices: unpack has a limit on how many values it returns.
for from = 1, #KEYS, 1000 do
  local to = math.min(from + 999, #KEYS)
  local got = redis.call('MGET', unpack(KEYS, from, to))
  for i = from, to do values[i] = got[i - from + 1] end
end
for i = 1, #KEYS, stride do batch_view[KEYS[i]] = values[i] end
local out = {now}
for c = 1, count do
  local k = (c - 1) * stride + 1
  if late and late[c] then
    out[c + 1] = {}
  else
    -- A block key holds a value while it lives: only then is its PTTL read,
    -- the wait a single call reports (rate_block.lua).
    local left = stride == 2 and values[k + 1] and redis.call('PTTL', KEYS[k + 1]) or 0
    if left > 0 then
      out[c + 1] = {left * 1000}
    else
      out[c + 1] = step(KEYS[k], same or costs[c])
    end
  end
end
-- A write that fails fails the whole call: no check is answered as
-- admitted without its write.
for key, px in pairs(batch_writes) do
  redis.call('SET', key, batch_view[key], 'PX', px)
end
return out
