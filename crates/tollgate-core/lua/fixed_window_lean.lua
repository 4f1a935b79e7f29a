-- The fixed window's step in a lean batch (rate_lean.lua): fixed_window.lua's
-- single-quota check. ARGV[2], ARGV[3]: limit and period (µs). The state is
-- this window's count.
local limit, period = ARGV[2] + 0, ARGV[3] + 0
local w, reset
local function step(key, cost, count, keep)
  -- `now` is set once per call, after this file runs.
  if not w then
    w = math.floor(now / period)
    reset = (w + 1) * period - now
  end
  count = count or window_count(key, w)
  if count + cost > limit then return count end
  -- Below 10^15 it reads back as written (window_count's 15 digits).
  if keep and count + cost < 1000000000000000 then return count, count + cost end
  window_store(key, w, count + cost, reset)
  return count, count + cost, true
end
local function write(key, count)
  window_store(key, w, count, reset)
end
