-- GCRA's step in a lean batch (rate_lean.lua): gcra.lua's single-quota
-- check without a wait. ARGV[2], ARGV[3]: burst and emission interval.
-- The state is the TAT (units of 1/per µs after now, ≥ 0).
local interval, per = interval_of(ARGV[3])
local limit_at = ARGV[2] * interval
local function step(key, cost, tat, keep)
  tat = tat or gcra_tat(key, per)
  local nt = tat + cost * interval
  if nt > limit_at then return tat end
  -- A TAT below 2^52 reads back as written (stored_instant's bound).
  if keep and nt < 4503599627370496 then return tat, nt end
  gcra_store(key, nt, per, 0)
  return tat, nt, true
end
local function write(key, nt)
  gcra_store(key, nt, per, 0)
end
