-- The fixed window's step in a lean batch (rate_lean.lua): fixed_window.lua's
-- single-quota check. ARGV[2], ARGV[3]: limit and period (µs). Returns the
-- count it decided from (this window's, before the check).
local limit, period = ARGV[2] + 0, ARGV[3] + 0
local w, reset
local function step(key, cost)
  -- `now` is set once per call, after this file runs.
  if not w then
    w = math.floor(now / period)
    reset = (w + 1) * period - now
  end
  local count = 0
  local v = stored_string(key)
  if v then
    -- Anything but "<digits>:<digits>" is not this script's: read as absent.
    local sw, sc = string.match(v, '^(%d+):(%d+)$')
    if sw and sw + 0 == w then count = sc + 0 end
  end
  if count + cost <= limit then
    store(key, string.format('%d:%d', w, count + cost), string.format('%d', math.ceil(reset / 1000)))
  end
  return count
end
