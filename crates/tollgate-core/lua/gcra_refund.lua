-- GCRA refund: the theoretical arrival time moves back by the cost's
-- emission intervals, never before now (a full bucket needs no key).
for i = 1, n - 1 do
  local key, interval = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local tat = stored_int(key)
  if tat then
    tat = tat - cost * interval
    if tat <= now then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000)))
    end
  end
end
return 1
