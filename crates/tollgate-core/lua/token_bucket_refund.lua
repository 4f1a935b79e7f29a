-- Token bucket refund: the tokens go back into the bucket, never above its
-- capacity (a full bucket needs no key). Time relative to now in units of
-- 1/per µs, as in token_bucket.lua.
for i = 1, n - 1 do
  local key = KEYS[i + 1]
  local interval, per = interval_of(ARGV[5 + 2 * i])
  local full = ARGV[4 + 2 * i] * interval
  local empty = stored_instant(key, per)
  -- Each quota's own span (after the quotas' parameters): past it, the
  -- quota may have refilled what the charge took, so nothing is given.
  local span = ARGV[5 + 2 * (n - 1) + i]
  if span and at + span <= now then empty = nil end
  if empty then
    empty = empty - cost * interval
    if empty <= -full then
      redis.call('DEL', key)
    else
      redis.call('SET', key, instant(empty, per), 'PX',
        string.format('%d', math.ceil(ceil_us(empty + full, per) / 1000)))
    end
  end
end
return 1
