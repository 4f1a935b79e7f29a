-- Sliding window counter: one string per key, "<window>:<previous count>:<current count>".
-- The estimate weights the previous window by how much of it still overlaps
-- the sliding window: ceil(previous * (period - elapsed) / period) + current.
-- KEYS[i]: one key per quota, all sharing one hash tag.
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost (both read by
-- rate_prelude.lua, which the loader prepends: `now`, `cost`, `n` = #KEYS). ARGV[3]: unused.
-- ARGV[2+2i], ARGV[3+2i]: limit and period (µs) of quota i.
-- Returns {allowed, now, then per quota: remaining, reset_after_us, retry_after_us,
-- next_us (until more quota is made available: draft-10's `t`; 0 when full)}:
-- the figures after counting the cost when every quota admits it, else the
-- figures as they stand (nothing is written: all or nothing).
-- Until the estimate drops by one unit, `e` µs into window of length `p`:
-- while the previous window weighs, when its rounded-up weight k falls to
-- k - 1; else, in the next window, when this window's weight first drops.
local function next_us(prev, cur, e, p)
  if prev > 0 then
    local k = math.floor((prev * (p - e) + p - 1) / p)
    return p - math.floor((k - 1) * p / prev) - e
  end
  if cur > 0 then return p - e + p - math.floor((cur - 1) * p / cur) end
  return 0
end
-- A stored window one ahead of now's (a clock ahead moved on: another
-- instance's, or the server's before a failover) is the current one: the
-- check is decided as at its start, its counts weighing in full — read as
-- absent, each clock would admit a limit in turn — and its times run
-- `lead` µs later than they would from there (0: none to wait).
local function later(t, lead)
  if t > 0 then return t + lead end
  return 0
end

if n == 1 then
  -- One quota: the same steps as the loop below, straight-line (no tables).
  local limit, p = ARGV[4] + 0, ARGV[5] + 0
  local w = math.floor(now / p)
  local e = now - w * p
  local prev, cur, lead = 0, 0, 0
  local v = stored_string(KEYS[1])
  if v then
    -- Anything but "<digits>:<digits>:<digits>" is not this script's: read as absent.
    local sw, sp, sc = string.match(v, '^(%d+):(%d+):(%d+)$')
    sw = sw and sw + 0
    if sw == w then
      prev, cur = sp + 0, sc + 0
    elseif sw == w - 1 then
      prev = sc + 0
    elseif sw == w + 1 then
      prev, cur, lead = sp + 0, sc + 0, (w + 1) * p - now
      w, e = w + 1, 0
    end
  end
  local est = cur + math.floor((prev * (p - e) + p - 1) / p)
  if est + cost > limit then
    local retry, reset = 0, 0
    if cur + cost <= limit then
      retry = p - math.floor((limit - cur - cost) * p / prev) - e
    else
      -- cur is 0 only for a cost above the limit (which never fits).
      retry = p - e + p - math.floor((limit - cost) * p / math.max(cur, 1))
    end
    if cur > 0 then reset = 2 * p - e elseif prev > 0 then reset = p - e end
    return {0, now, math.max(limit - est, 0), later(reset, lead), later(retry, lead),
      later(next_us(prev, cur, e, p), lead)}
  end
  store(KEYS[1], string.format('%d:%d:%d', w, prev, cur + cost), string.format('%d', math.ceil((2 * p - e + lead) / 1000)))
  return {1, now, limit - est - cost, 2 * p - e + lead, 0, later(next_us(prev, cur + cost, e, p), lead)}
end
local w, e, prev, cur, est, limit, period, lead, ok = {}, {}, {}, {}, {}, {}, {}, {}, true
for i = 1, n do
  limit[i], period[i] = ARGV[2 + 2 * i] + 0, ARGV[3 + 2 * i] + 0
  w[i] = math.floor(now / period[i])
  e[i] = now - w[i] * period[i]
  prev[i], cur[i], lead[i] = 0, 0, 0
  local v = stored_string(KEYS[i])
  if v then
    local sw, sp, sc = string.match(v, '^(%d+):(%d+):(%d+)$')
    sw = sw and sw + 0
    if sw == w[i] then
      prev[i], cur[i] = sp + 0, sc + 0
    elseif sw == w[i] - 1 then
      prev[i] = sc + 0
    elseif sw == w[i] + 1 then
      prev[i], cur[i], lead[i] = sp + 0, sc + 0, (w[i] + 1) * period[i] - now
      w[i], e[i] = w[i] + 1, 0
    end
  end
  est[i] = cur[i] + math.floor((prev[i] * (period[i] - e[i]) + period[i] - 1) / period[i])
  if est[i] + cost > limit[i] then ok = false end
end
local out = {ok and 1 or 0, now}
for i = 1, n do
  local j = 4 * i - 1
  local p = period[i]
  if ok then
    store(KEYS[i], string.format('%d:%d:%d', w[i], prev[i], cur[i] + cost), string.format('%d', math.ceil((2 * p - e[i] + lead[i]) / 1000)))
    out[j], out[j + 1], out[j + 2] = limit[i] - est[i] - cost, 2 * p - e[i] + lead[i], 0
    out[j + 3] = later(next_us(prev[i], cur[i] + cost, e[i], p), lead[i])
  else
    local retry, reset = 0, 0
    if est[i] + cost > limit[i] then
      if cur[i] + cost <= limit[i] then
        -- Later in this window, once the previous window's weight has dropped.
        retry = p - math.floor((limit[i] - cur[i] - cost) * p / prev[i]) - e[i]
      else
        -- In the next window, once this window's weight has dropped.
        -- cur is 0 only for a cost above the limit (which never fits).
        retry = p - e[i] + p - math.floor((limit[i] - cost) * p / math.max(cur[i], 1))
      end
    end
    if cur[i] > 0 then reset = 2 * p - e[i] elseif prev[i] > 0 then reset = p - e[i] end
    out[j], out[j + 1], out[j + 2] = math.max(limit[i] - est[i], 0), later(reset, lead[i]), later(retry, lead[i])
    out[j + 3] = later(next_us(prev[i], cur[i], e[i], p), lead[i])
  end
end
return out
