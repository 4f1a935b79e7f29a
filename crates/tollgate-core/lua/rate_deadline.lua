-- KEYS: one key per quota, then, when operators' blocks apply, the
-- subject's block key (rate_block.lua): the quotas are counted from ARGV,
-- two parameters each after the first three.
n = math.floor((#ARGV - 3) / 2)
-- A check whose caller has stopped waiting is not decided: the caller was
-- answered without it (by the failure policy), so it must take nothing.
-- ARGV[4+2n], after the quotas' parameters: the last instant (server µs) at
-- which it may still be decided; absent for none. Returns {-1, now}: late.
local deadline = ARGV[4 + 2 * n]
if deadline and now > deadline + 0 then return {-1, now} end
