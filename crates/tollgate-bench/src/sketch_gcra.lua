-- The least work a GCRA decision on Redis can cost (a bound for the peers
-- item, not tollgate's script): N subjects of one quota in one call, one
-- TIME, one MGET, one SET … PX per admission, one integer per check back.
-- No strict parsing, no blocks, no deadlines, no figures.
-- KEYS: the subjects' keys. ARGV[1]: the burst; ARGV[2]: the emission
-- interval in µs. The stored value is the theoretical arrival time (µs).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[1]) * interval
local tats = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local tat = tonumber(tats[i]) or now
  if tat < now then tat = now end
  local nt = tat + interval
  if nt - now > tolerance then
    out[i] = 0
  else
    redis.call('SET', KEYS[i], nt, 'PX', math.floor((nt - now) / 1000) + 1)
    out[i] = 1
  end
end
return out
