-- Fixed window settle. Under the estimate: the window charged gets the
-- difference back (never below zero); once that window has passed, nothing
-- is owed. Over it: the window current now (a new one starts at zero, as
-- the check reads it; a later one a clock ahead wrote stays) counts the
-- difference, never above limit + debt.
if applied then
  for i = 1, q do
    local key, limit, period = KEYS[i + 1], ARGV[7 + 2 * i] + 0, ARGV[8 + 2 * i] + 0
    local v = stored_string(key)
    local w, count
    if v then w, count = string.match(v, '^(%d+):(%d+)$') end
    if w then w, count = w + 0, count + 0 end
    if give > 0 then
      if w and w == math.floor(at / period) then
        rewrite(key, string.format('%d:%d', w, math.max(count - give, 0)))
      end
    else
      -- The window current now, or the next one a clock ahead wrote (as
      -- window_count reads it).
      local current = math.floor(now / period)
      if w ~= current and w ~= current + 1 then w, count = current, 0 end
      count = math.min(count + owe, math.max(count, limit + debt_of(i)))
      redis.call('SET', key, string.format('%d:%d', w, count), 'PX',
        string.format('%d', math.ceil(((w + 1) * period - now) / 1000)))
    end
  end
end
