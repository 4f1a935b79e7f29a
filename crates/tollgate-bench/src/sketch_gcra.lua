-- The least work a GCRA decision on Redis can cost (a bound for the bench,
-- not tollgate's script): N checks of one quota in one call, one TIME, one
-- MGET, one SET … PX per key admitted (a key checked again in the call
-- decides from the value its last admission left), one integer per check
-- back. No strict parsing, no blocks, no deadlines, no figures.
-- KEYS: each check's key. ARGV[1]: the burst; ARGV[2]: the emission
-- interval in µs. The stored value is the theoretical arrival time (µs).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[1]) * interval
local tats = redis.call('MGET', unpack(KEYS))
local admitted, out = {}, {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local tat = admitted[key] or tonumber(tats[i]) or now
  if tat < now then tat = now end
  local nt = tat + interval
  if nt - now > tolerance then
    out[i] = 0
  else
    admitted[key] = nt
    out[i] = 1
  end
end
for key, nt in pairs(admitted) do
  -- Formatted here: Redis's own conversion of a Lua number ('%.17g')
  -- costs more than string.format('%d') of a whole number.
  redis.call('SET', key, string.format('%d', nt), 'PX', string.format('%d', math.floor((nt - now) / 1000) + 1))
end
return out
