-- GCRA: one integer per key, the theoretical arrival time (TAT) in microseconds.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS). ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: burst and emission interval (µs) of quota i.
-- Returns {allowed, then per quota: remaining, reset_after_us, retry_after_us}:
-- the figures after taking the cost when every quota admits it, else the
-- figures as they stand (nothing is written: all or nothing).
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables),
  -- which saves about a fifth of the script's CPU.
  local interval = ARGV[5] + 0
  local limit_at = now + ARGV[4] * interval
  -- tonumber(): a value this script did not write reads as no value.
  local tat = tonumber(redis.call('GET', KEYS[1])) or now
  if tat < now then tat = now end
  local nt = tat + cost * interval
  if nt > limit_at then
    return {0, math.floor((limit_at - tat) / interval), tat - now, nt - limit_at}
  end
  local px = math.ceil((nt - now) / 1000)
  if px < 1 then px = 1 end
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  redis.call('SET', KEYS[1], string.format('%d', nt), 'PX', string.format('%d', px))
  return {1, math.floor((limit_at - nt) / interval), nt - now, 0}
end
local tat, nt, limit_at, interval, ok = {}, {}, {}, {}, true
for i = 1, n do
  interval[i] = ARGV[3 + 2 * i] + 0
  limit_at[i] = now + ARGV[2 + 2 * i] * interval[i]
  local t = tonumber(redis.call('GET', KEYS[i])) or now
  if t < now then t = now end
  tat[i], nt[i] = t, t + cost * interval[i]
  if nt[i] > limit_at[i] then ok = false end
end
local out = {ok and 1 or 0}
for i = 1, n do
  local j = 3 * i - 1
  if ok then
    -- %d: Lua's default number format keeps only 14 digits.
    -- At least 1 ms: a cost of 0 on an idle key leaves nt = now.
    local px = math.ceil((nt[i] - now) / 1000)
    if px < 1 then px = 1 end
    redis.call('SET', KEYS[i], string.format('%d', nt[i]), 'PX', string.format('%d', px))
    out[j], out[j + 1], out[j + 2] = math.floor((limit_at[i] - nt[i]) / interval[i]), nt[i] - now, 0
  else
    out[j], out[j + 1] = math.floor((limit_at[i] - tat[i]) / interval[i]), tat[i] - now
    out[j + 2] = math.max(nt[i] - limit_at[i], 0)
  end
end
return out
