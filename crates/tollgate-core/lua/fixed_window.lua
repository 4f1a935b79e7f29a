-- Fixed window aligned to the epoch: one string per key, "<window index>:<count>".
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS). ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: limit and period (µs) of quota i.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; the window's end)}:
-- the figures after counting the cost when every quota admits it, else the
-- figures as they stand (nothing is written: all or nothing).
if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables).
  local limit, period = ARGV[4] + 0, ARGV[5] + 0
  local count, w = window_count(KEYS[1], math.floor(now / period))
  local reset = (w + 1) * period - now
  if count + cost > limit then
    return {0, now, limit - count, reset, reset, reset}
  end
  window_store(KEYS[1], w, count + cost, reset)
  return {1, now, limit - count - cost, reset, 0, reset}
end
local w, count, limit, reset, ok = {}, {}, {}, {}, true
for i = 1, n do
  local period = ARGV[3 + 2 * i] + 0
  limit[i] = ARGV[2 + 2 * i] + 0
  count[i], w[i] = window_count(KEYS[i], math.floor(now / period))
  reset[i] = (w[i] + 1) * period - now
  if count[i] + cost > limit[i] then ok = false end
end
local out = {ok and 1 or 0, now}
for i = 1, n do
  local j = 4 * i - 1
  out[j + 3] = reset[i]
  if ok then
    window_store(KEYS[i], w[i], count[i] + cost, reset[i])
    out[j], out[j + 1], out[j + 2] = limit[i] - count[i] - cost, reset[i], 0
  else
    local retry = 0
    if count[i] + cost > limit[i] then retry = reset[i] end
    out[j], out[j + 1], out[j + 2] = limit[i] - count[i], reset[i], retry
  end
end
return out
