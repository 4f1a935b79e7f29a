-- GCRA: one integer per key, the theoretical arrival time (TAT) in microseconds.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost. ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: burst and emission interval (µs) of quota i.
-- Returns {allowed, then per quota: remaining, reset_after_us, retry_after_us}.
-- All-or-nothing: nothing is written unless every quota admits the cost.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local out, new, ok = {1}, {}, true
for i = 1, #KEYS do
  local burst, interval = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local limit_at = now + burst * interval
  local nt = tat + cost * interval
  local j = 3 * i - 1
  if nt > limit_at then
    ok = false
    out[j], out[j + 1], out[j + 2] = math.floor((limit_at - tat) / interval), tat - now, nt - limit_at
  else
    new[i] = nt
    out[j], out[j + 1], out[j + 2] = math.floor((limit_at - nt) / interval), nt - now, 0
  end
end
if ok then
  for i = 1, #KEYS do
    -- %d: Lua's default number format keeps only 14 digits.
    redis.call('SET', KEYS[i], string.format('%d', new[i]), 'PX', math.ceil((new[i] - now) / 1000))
  end
else
  out[1] = 0
end
return out
