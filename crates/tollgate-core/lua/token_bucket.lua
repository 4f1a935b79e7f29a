-- Token bucket in one integer per key: the instant (µs) at which the bucket was
-- last empty. tokens(now) = min(capacity, floor((now - empty_at) / interval)).
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS). ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: capacity and refill interval per token (µs) of quota i.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after taking the tokens when every quota has them, else the
-- figures as they stand (nothing is written: all or nothing).
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables),
  -- which saves about a fifth of the script's CPU.
  local interval = ARGV[5] + 0
  local capacity = ARGV[4] + 0
  local full = capacity * interval
  -- A value this script did not write reads as no value.
  local empty_at = stored_int(KEYS[1]) or (now - full)
  if empty_at < now - full then empty_at = now - full end
  local tokens = math.floor((now - empty_at) / interval)
  local after = empty_at + cost * interval
  if tokens < cost then
    return {0, now, tokens, empty_at + full - now, after - now,
      tokens < capacity and interval - (now - empty_at) % interval or 0}
  end
  local px = math.ceil((after + full - now) / 1000)
  if px < 1 then px = 1 end
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  redis.call('SET', KEYS[1], string.format('%d', after), 'PX', string.format('%d', px))
  -- The next token comes when the elapsed time reaches a whole interval.
  return {1, now, tokens - cost, after + full - now, 0,
    tokens - cost < capacity and interval - (now - after) % interval or 0}
end
local empty_at, tokens, full, ok = {}, {}, {}, true
for i = 1, n do
  local interval = ARGV[3 + 2 * i] + 0
  full[i] = ARGV[2 + 2 * i] * interval
  local e = stored_int(KEYS[i]) or (now - full[i])
  -- A full bucket holds no more than its capacity.
  if e < now - full[i] then e = now - full[i] end
  empty_at[i], tokens[i] = e, math.floor((now - e) / interval)
  if tokens[i] < cost then ok = false end
end
local out = {ok and 1 or 0, now}
for i = 1, n do
  local j = 4 * i - 1
  local interval = ARGV[3 + 2 * i] + 0
  local capacity = ARGV[2 + 2 * i] + 0
  local after = empty_at[i] + cost * interval
  if ok then
    -- The key is worthless once the bucket is full again: expire it then.
    -- At least 1 ms: a cost of 0 on a full bucket leaves nothing to wait for.
    local px = math.ceil((after + full[i] - now) / 1000)
    if px < 1 then px = 1 end
    redis.call('SET', KEYS[i], string.format('%d', after), 'PX', string.format('%d', px))
    out[j], out[j + 1], out[j + 2] = tokens[i] - cost, after + full[i] - now, 0
    out[j + 3] = tokens[i] - cost < capacity and interval - (now - after) % interval or 0
  else
    out[j], out[j + 1], out[j + 2] = tokens[i], empty_at[i] + full[i] - now, math.max(after - now, 0)
    out[j + 3] = tokens[i] < capacity and interval - (now - empty_at[i]) % interval or 0
  end
end
return out
