-- Fixed window refund: the window charged gets the cost back (never below
-- zero); once that window has passed, nothing is owed.
for i = 1, n - 1 do
  local key, period = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local v = redis.call('GET', key)
  local sep = v and string.find(v, ':', 1, true)
  if sep then
    local w, count = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
    if count and w == math.floor(at / period) then
      rewrite(key, string.format('%d:%d', w, math.max(count - cost, 0)))
    end
  end
end
return 1
