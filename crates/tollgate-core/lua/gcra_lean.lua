-- GCRA's step in a lean batch (rate_lean.lua): gcra.lua's single-quota
-- check without a wait. ARGV[2], ARGV[3]: burst and emission interval.
-- Returns the TAT it decided from (units of 1/per µs after now, ≥ 0) and
-- whether it admitted the check.
local interval, per = interval_of(ARGV[3])
local limit_at = ARGV[2] * interval
local function step(key, cost)
  local tat = gcra_tat(key, per)
  local nt = tat + cost * interval
  if nt > limit_at then return tat, false end
  gcra_store(key, nt, per, 0)
  return tat, true
end
