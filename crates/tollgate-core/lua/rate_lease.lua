-- A quota lease: takes min(available, want) units of a subject on every
-- quota in one call, for the caller to serve locally. The loader puts before
-- it rate_args.lua, rate_deadline.lua, rate_prelude.lua, rate_block.lua (a
-- blocked subject leases nothing) and the algorithm's check script wrapped as
-- `local function check(KEYS, ARGV)`: what is available and the take itself
-- are the algorithm's own check, run with cost 0 and then with cost k.
-- ARGV as a check's, except ARGV[2] (cost): the units the caller needs now,
-- and ARGV[3]: '<want>:<least>', the lease's size and the fewest units worth
-- a lease. With fewer available, the call is an ordinary check of ARGV[2]
-- units: its decision (and a denial's retry-after) is a plain check's.
-- Returns {granted, then the take's reply as a check's}: granted is 0 when
-- nothing was leased.
local want, least = string.match(ARGV[3], '^(%d+):(%d+)$')
want, least = want + 0, least + 0
local args = {ARGV[1], ARGV[2], ''}
for i = 1, n do
  args[2 + 2 * i], args[3 + 2 * i] = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
end
cost = 0
local k = want
local peek = check(KEYS, args)
for i = 1, n do
  local left = peek[4 * i - 1]
  if left < k then k = left end
end
-- Fewer than the least: no lease, the caller's own check.
if k < least then
  cost = ARGV[2] + 0
  local reply = check(KEYS, args)
  table.insert(reply, 1, 0)
  return reply
end
cost = k
local reply = check(KEYS, args)
table.insert(reply, 1, reply[1] == 1 and k or 0)
return reply
