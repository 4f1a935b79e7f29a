-- GCRA: one integer per key, the theoretical arrival time (TAT) in microseconds.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS). ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: burst and emission interval (µs) of quota i.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after taking the cost when every quota admits it, else the
-- figures as they stand (nothing is written: all or nothing).
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables),
  -- which saves about a fifth of the script's CPU.
  local interval = ARGV[5] + 0
  local limit_at = now + ARGV[4] * interval
  -- A value this script did not write reads as no value.
  local tat = stored_int(KEYS[1]) or now
  if tat < now then tat = now end
  local nt = tat + cost * interval
  -- One more unit is made available when limit_at - tat reaches the next
  -- whole interval (as time passes, limit_at moves and the TAT stays).
  if nt > limit_at then
    local room = limit_at - tat
    return {0, now, math.floor(room / interval), tat - now, nt - limit_at,
      tat > now and interval - room % interval or 0}
  end
  local px = math.ceil((nt - now) / 1000)
  if px < 1 then px = 1 end
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  redis.call('SET', KEYS[1], string.format('%d', nt), 'PX', string.format('%d', px))
  local room = limit_at - nt
  return {1, now, math.floor(room / interval), nt - now, 0,
    nt > now and interval - room % interval or 0}
end
local tat, nt, limit_at, interval, ok = {}, {}, {}, {}, true
for i = 1, n do
  interval[i] = ARGV[3 + 2 * i] + 0
  limit_at[i] = now + ARGV[2 + 2 * i] * interval[i]
  local t = stored_int(KEYS[i]) or now
  if t < now then t = now end
  tat[i], nt[i] = t, t + cost * interval[i]
  if nt[i] > limit_at[i] then ok = false end
end
local out = {ok and 1 or 0, now}
for i = 1, n do
  local j = 4 * i - 1
  if ok then
    -- %d: Lua's default number format keeps only 14 digits.
    -- At least 1 ms: a cost of 0 on an idle key leaves nt = now.
    local px = math.ceil((nt[i] - now) / 1000)
    if px < 1 then px = 1 end
    redis.call('SET', KEYS[i], string.format('%d', nt[i]), 'PX', string.format('%d', px))
    local room = limit_at[i] - nt[i]
    out[j], out[j + 1], out[j + 2] = math.floor(room / interval[i]), nt[i] - now, 0
    out[j + 3] = nt[i] > now and interval[i] - room % interval[i] or 0
  else
    local room = limit_at[i] - tat[i]
    out[j], out[j + 1] = math.floor(room / interval[i]), tat[i] - now
    out[j + 2] = math.max(nt[i] - limit_at[i], 0)
    out[j + 3] = tat[i] > now and interval[i] - room % interval[i] or 0
  end
end
return out
