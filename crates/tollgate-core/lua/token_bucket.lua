-- Token bucket in one instant per key: when the bucket was last empty.
-- tokens(now) = min(capacity, floor((now - empty_at) / interval)).
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS).
-- ARGV[3]: how long the caller may wait for a slot (whole µs), or '' for none.
-- ARGV[2+2i], ARGV[3+2i]: capacity and exact refill interval per token
-- ('<ticks>[/<per>]' µs, see interval_of) of quota i. Time below is relative
-- to now, in units of 1/per µs: the empty instant is ≤ 0 once it counts.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after taking the tokens when every quota has them, else the
-- figures as they stand (nothing is written: all or nothing). Figures in µs
-- are rounded up.
-- Tokens that come only later, within the wait, are taken for their slot, the
-- earliest instant every quota has them (a reservation: the empty instant
-- lies ahead): the check that instant would make is made now, and every
-- quota's retry_after_us is the wait (an admission without one replies 0),
-- with the other figures as of the slot. The wait is read only when the
-- tokens are not there now.
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables),
  -- which saves about a fifth of the script's CPU.
  local interval, per = interval_of(ARGV[5])
  local capacity = ARGV[4] + 0
  local full = capacity * interval
  -- A value this script did not write reads as no value.
  local empty = bucket_empty(KEYS[1], per, full)
  local tokens = math.floor(-empty / interval)
  local after = empty + cost * interval
  local wait = 0
  if tokens < cost then
    if ARGV[3] == '' or after > ARGV[3] * per then
      return {0, now, tokens, ceil_us(empty + full, per), ceil_us(after, per),
        tokens < capacity and ceil_us(unit_after(-empty, interval), per) or 0}
    end
    -- The check at the slot: time moves on by the wait.
    wait = ceil_us(after, per)
    now, empty = now + wait, empty - wait * per
    if empty < -full then empty = -full end
    tokens = math.floor(-empty / interval)
    after = empty + cost * interval
  end
  bucket_store(KEYS[1], after, per, full, wait)
  -- The next token comes when the elapsed time reaches a whole interval.
  return {1, now - wait, tokens - cost, ceil_us(after + full, per), wait,
    tokens - cost < capacity and ceil_us(unit_after(-after, interval), per) or 0}
end
local empty, tokens, full, interval, per, ok = {}, {}, {}, {}, {}, true
for i = 1, n do
  interval[i], per[i] = interval_of(ARGV[3 + 2 * i])
  full[i] = ARGV[2 + 2 * i] * interval[i]
  local e = bucket_empty(KEYS[i], per[i], full[i])
  empty[i], tokens[i] = e, math.floor(-e / interval[i])
  if tokens[i] < cost then ok = false end
end
local wait = 0
if not ok and ARGV[3] ~= '' then
  -- Every quota's own wait, and the longest: a reservation if each fits.
  local most = ARGV[3] + 0
  ok = true
  for i = 1, n do
    local after = empty[i] + cost * interval[i]
    if after > most * per[i] then ok = false end
    wait = math.max(wait, ceil_us(after, per[i]))
  end
  if ok then
    -- The check at the slot: each bucket as the request arriving then finds it.
    now = now + wait
    for i = 1, n do
      empty[i] = math.max(empty[i] - wait * per[i], -full[i])
      tokens[i] = math.floor(-empty[i] / interval[i])
    end
  else
    wait = 0
  end
end
local out = {ok and 1 or 0, now - wait}
for i = 1, n do
  local j = 4 * i - 1
  local iv, p = interval[i], per[i]
  local capacity = ARGV[2 + 2 * i] + 0
  local after = empty[i] + cost * iv
  if ok then
    -- The key is worthless once the bucket is full again: expire it then.
    -- At least 1 ms: a cost of 0 on a full bucket leaves nothing to wait for.
    bucket_store(KEYS[i], after, p, full[i], wait)
    out[j], out[j + 1], out[j + 2] = tokens[i] - cost, ceil_us(after + full[i], p), wait
    out[j + 3] = tokens[i] - cost < capacity and ceil_us(unit_after(-after, iv), p) or 0
  else
    out[j], out[j + 1], out[j + 2] = tokens[i], ceil_us(empty[i] + full[i], p), math.max(ceil_us(after, p), 0)
    out[j + 3] = tokens[i] < capacity and ceil_us(unit_after(-empty[i], iv), p) or 0
  end
end
return out
