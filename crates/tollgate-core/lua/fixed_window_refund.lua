-- Fixed window refund: the window charged gets the cost back (never below
-- zero); once that window has passed, nothing is owed.
for i = 1, n - 1 do
  local key, period = KEYS[i + 1], ARGV[5 + 2 * i] + 0
  local v = stored_string(key)
  local w, count
  if v then w, count = string.match(v, '^(%d+):(%d+)$') end
  if w and w + 0 == math.floor(at / period) then
    rewrite(key, string.format('%d:%d', w, math.max(count - cost, 0)))
  end
end
return 1
