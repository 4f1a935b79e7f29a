-- GCRA's step in a lean batch (rate_lean.lua): gcra.lua's single-quota
-- check without a wait. ARGV[2], ARGV[3]: burst and emission interval.
-- Returns the TAT it decided from (units of 1/per µs after now, ≥ 0).
local interval, per = interval_of(ARGV[3])
local limit_at = ARGV[2] * interval
local function step(key, cost)
  local tat = stored_instant(key, per) or 0
  if tat < 0 then tat = 0 end
  local nt = tat + cost * interval
  if nt <= limit_at then
    local px = math.ceil(ceil_us(nt, per) / 1000)
    if px < 1 then px = 1 end
    store(key, instant(nt, per), string.format('%d', px))
  end
  return tat
end
