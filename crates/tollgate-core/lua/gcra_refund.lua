-- GCRA refund: the theoretical arrival time moves back by the cost's
-- emission intervals, never before now (a full bucket needs no key). Time
-- relative to now in units of 1/per µs, as in gcra.lua.
for i = 1, n - 1 do
  local key = KEYS[i + 1]
  local interval, per = interval_of(ARGV[5 + 2 * i])
  local tat = stored_instant(key, per)
  -- Each quota's own span (after the quotas' parameters): past it, the
  -- quota may have refilled what the charge took, so nothing is given.
  local span = ARGV[5 + 2 * (n - 1) + i]
  if span and at + span <= now then tat = nil end
  if tat then
    tat = tat - cost * interval
    if tat <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key, instant(tat, per), 'PX', string.format('%d', math.ceil(ceil_us(tat, per) / 1000)))
    end
  end
end
return 1
