-- Token bucket refund: the tokens go back into the bucket, never above its
-- capacity (a full bucket needs no key).
for i = 1, n - 1 do
  local key, interval = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local full = ARGV[4 + 2 * i] * interval
  local empty_at = stored_int(key)
  if empty_at then
    empty_at = empty_at - cost * interval
    if empty_at <= now - full then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%d', empty_at), 'PX',
        string.format('%d', math.ceil((empty_at + full - now) / 1000)))
    end
  end
end
return 1
