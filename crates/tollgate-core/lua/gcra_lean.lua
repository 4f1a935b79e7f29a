-- GCRA's step in a lean batch (rate_lean.lua): gcra.lua's single-quota
-- check without a wait. ARGV[2], ARGV[3]: burst and emission interval.
-- The state is the TAT (units of 1/per µs after now, ≥ 0).
local interval, per = interval_of(ARGV[3])
local limit_at = ARGV[2] * interval
local function step(key, cost, tat)
  tat = tat or gcra_tat(key, per)
  local nt = tat + cost * interval
  if nt <= limit_at then return tat, nt end
  return tat
end
local function write(key, nt)
  gcra_store(key, nt, per, 0)
end
-- A TAT below it reads back as written (stored_instant's bound).
local exact_below = 4503599627370496
