-- Sliding window counter refund: the window charged gets the cost back,
-- whether it is still the current window or has become the previous one
-- (still weighed); never below zero; two windows on, nothing is owed.
for i = 1, n - 1 do
  local key, period = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local v = redis.call('GET', key)
  local a = v and string.find(v, ':', 1, true)
  local b = a and string.find(v, ':', a + 1, true)
  if b then
    local w = tonumber(string.sub(v, 1, a - 1))
    local prev, cur = tonumber(string.sub(v, a + 1, b - 1)), tonumber(string.sub(v, b + 1))
    local charged = math.floor(at / period)
    if prev and cur and w == charged then
      rewrite(key, string.format('%d:%d:%d', w, prev, math.max(cur - cost, 0)))
    elseif prev and cur and w == charged + 1 then
      rewrite(key, string.format('%d:%d:%d', w, math.max(prev - cost, 0), cur))
    end
  end
end
return 1
