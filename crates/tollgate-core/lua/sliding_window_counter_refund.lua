-- Sliding window counter refund: the window charged gets the cost back,
-- whether it is still the current window or has become the previous one
-- (still weighed); never below zero; two windows on, nothing is owed.
for i = 1, n - 1 do
  local key, period = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local v = stored_string(key)
  local w, prev, cur
  if v then w, prev, cur = string.match(v, '^(%d+):(%d+):(%d+)$') end
  if w then
    w, prev, cur = w + 0, prev + 0, cur + 0
    local charged = math.floor(at / period)
    if w == charged then
      rewrite(key, string.format('%d:%d:%d', w, prev, math.max(cur - cost, 0)))
    elseif w == charged + 1 then
      rewrite(key, string.format('%d:%d:%d', w, math.max(prev - cost, 0), cur))
    end
  end
end
return 1
