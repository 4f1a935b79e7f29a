-- Sliding window counter settle. Under the estimate: the window charged
-- gets the difference back, whether it is still the current window or has
-- become the previous one (still weighed); never below zero; two windows
-- on, nothing is owed. Over it: the windows rotate as the check script
-- rotates them, and the current one counts the difference, never above
-- limit + debt.
if applied then
  for i = 1, q do
    local key, limit, p = KEYS[i + 1], ARGV[7 + 2 * i] + 0, ARGV[8 + 2 * i] + 0
    local v = stored_string(key)
    local w, prev, cur
    if v then w, prev, cur = string.match(v, '^(%d+):(%d+):(%d+)$') end
    if w then w, prev, cur = w + 0, prev + 0, cur + 0 end
    if give > 0 then
      local charged = math.floor(at / p)
      if w == charged then
        rewrite(key, string.format('%d:%d:%d', w, prev, math.max(cur - give, 0)))
      elseif w and w == charged + 1 then
        rewrite(key, string.format('%d:%d:%d', w, math.max(prev - give, 0), cur))
      end
    else
      local current = math.floor(now / p)
      if w == current or w == current + 1 then
        -- As stored (one ahead: a clock ahead moved on, as the check reads it).
        current = w
      elseif w == current - 1 then
        prev, cur = cur, 0
      else
        prev, cur = 0, 0
      end
      cur = math.min(cur + owe, math.max(cur, limit + debt_of(i)))
      redis.call('SET', key, string.format('%d:%d:%d', current, prev, cur), 'PX',
        string.format('%d', math.ceil((2 * p - (now - current * p)) / 1000)))
    end
  end
end
