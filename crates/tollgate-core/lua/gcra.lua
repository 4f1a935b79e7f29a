-- GCRA: one instant per key, the theoretical arrival time (TAT).
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS).
-- ARGV[3]: how long the caller may wait for a slot (whole µs), or '' for none.
-- ARGV[2+2i], ARGV[3+2i]: burst and exact emission interval ('<ticks>[/<per>]' µs,
-- see interval_of) of quota i. Time below is relative to now, in units of 1/per µs.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after taking the cost when every quota admits it, else the
-- figures as they stand (nothing is written: all or nothing). Figures in µs
-- are rounded up.
-- A cost that fits only later, within the wait, is admitted at its slot, the
-- earliest instant every quota admits it (a reservation): the check that
-- instant would make is made now, and every quota's retry_after_us is the wait
-- (an admission without one replies 0), with the other figures as of the slot.
-- The wait is read only when the cost does not fit now.
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables),
  -- which saves about a fifth of the script's CPU.
  local interval, per = interval_of(ARGV[5])
  local limit_at = ARGV[4] * interval
  -- A value this script did not write reads as no value.
  local tat = gcra_tat(KEYS[1], per)
  local nt = tat + cost * interval
  local wait = 0
  -- One more unit is made available when limit_at - tat reaches the next
  -- whole interval (as time passes, limit_at moves and the TAT stays).
  if nt > limit_at then
    if ARGV[3] == '' or nt - limit_at > ARGV[3] * per then
      local room = limit_at - tat
      return {0, now, math.floor(room / interval), ceil_us(tat, per), ceil_us(nt - limit_at, per),
        tat > 0 and ceil_us(unit_after(room, interval), per) or 0}
    end
    -- The check at the slot: time moves on by the wait.
    wait = ceil_us(nt - limit_at, per)
    now, tat = now + wait, tat - wait * per
    if tat < 0 then tat = 0 end
    nt = tat + cost * interval
  end
  gcra_store(KEYS[1], nt, per, wait)
  local room = limit_at - nt
  return {1, now - wait, math.floor(room / interval), ceil_us(nt, per), wait,
    nt > 0 and ceil_us(unit_after(room, interval), per) or 0}
end
local tat, nt, limit_at, interval, per, ok = {}, {}, {}, {}, {}, true
for i = 1, n do
  interval[i], per[i] = interval_of(ARGV[3 + 2 * i])
  limit_at[i] = ARGV[2 + 2 * i] * interval[i]
  local t = gcra_tat(KEYS[i], per[i])
  tat[i], nt[i] = t, t + cost * interval[i]
  if nt[i] > limit_at[i] then ok = false end
end
local wait = 0
if not ok and ARGV[3] ~= '' then
  -- Every quota's own wait, and the longest: a reservation if each fits.
  local most = ARGV[3] + 0
  ok = true
  for i = 1, n do
    if nt[i] - limit_at[i] > most * per[i] then ok = false end
    wait = math.max(wait, ceil_us(nt[i] - limit_at[i], per[i]))
  end
  if ok then
    -- The check at the slot: each quota as the request arriving then finds it.
    now = now + wait
    for i = 1, n do
      tat[i] = math.max(tat[i] - wait * per[i], 0)
      nt[i] = tat[i] + cost * interval[i]
    end
  else
    wait = 0
  end
end
local out = {ok and 1 or 0, now - wait}
for i = 1, n do
  local j = 4 * i - 1
  local iv, p = interval[i], per[i]
  if ok then
    gcra_store(KEYS[i], nt[i], p, wait)
    local room = limit_at[i] - nt[i]
    out[j], out[j + 1], out[j + 2] = math.floor(room / iv), ceil_us(nt[i], p), wait
    out[j + 3] = nt[i] > 0 and ceil_us(unit_after(room, iv), p) or 0
  else
    local room = limit_at[i] - tat[i]
    out[j], out[j + 1] = math.floor(room / iv), ceil_us(tat[i], p)
    out[j + 2] = math.max(ceil_us(nt[i] - limit_at[i], p), 0)
    out[j + 3] = tat[i] > 0 and ceil_us(unit_after(room, iv), p) or 0
  end
end
return out
