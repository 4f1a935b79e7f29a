-- A quota lease: takes min(available, want) units of a subject on every
-- quota in one call, for the caller to serve locally. The loader puts before
-- it rate_args.lua, rate_deadline.lua, rate_prelude.lua, rate_block.lua (a
-- blocked subject leases nothing) and the algorithm's check script wrapped as
-- `local function check(KEYS, ARGV)`: what is available and the take itself
-- are the algorithm's own check, run with cost 0 and then with cost k.
-- ARGV as a check's, except ARGV[2] (cost): the units the caller needs now,
-- and ARGV[3]: '<want>:<least>', the lease's size and the fewest units worth
-- a lease (a take below it is refused as a check of that many units is, with
-- its retry-after: that is when this caller may lease again).
-- Returns {granted, then the take's reply as a check's}: granted is 0 when
-- the take was refused.
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
-- Fewer than the least: the take of the least is refused, as a check.
if k < least then k = least end
cost = k
local reply = check(KEYS, args)
table.insert(reply, 1, reply[1] == 1 and k or 0)
return reply
