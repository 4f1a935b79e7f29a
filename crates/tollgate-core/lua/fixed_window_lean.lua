-- The fixed window's step in a lean batch (rate_lean.lua): fixed_window.lua's
-- single-quota check. ARGV[2], ARGV[3]: limit and period (µs). Returns the
-- count it decided from (this window's, before the check) and whether it
-- admitted the check.
local limit, period = ARGV[2] + 0, ARGV[3] + 0
local w, reset
local function step(key, cost)
  -- `now` is set once per call, after this file runs.
  if not w then
    w = math.floor(now / period)
    reset = (w + 1) * period - now
  end
  local count = window_count(key, w)
  if count + cost > limit then return count, false end
  window_store(key, w, count + cost, reset)
  return count, true
end
