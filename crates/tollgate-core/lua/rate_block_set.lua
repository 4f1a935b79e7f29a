-- Blocks a subject (an operator's action): KEYS[1], its block key, lives
-- for the block (check scripts read its PTTL); its value is the block's
-- end on the server's clock (µs), for a reader's information.
-- ARGV[1]: the block's length in ms (> 0). ARGV[2]: '1' to block for at
-- least that long (a block that lasts longer stays: a later, shorter wait
-- an upstream asks for must not lift an earlier, longer one), else the
-- block replaces any earlier one. Returns the block in force, in ms left.
local t = redis.call('TIME')
local ends = t[1] * 1000000 + t[2] + ARGV[1] * 1000
if ARGV[2] == '1' then
  local left = redis.call('PTTL', KEYS[1])
  if left >= ARGV[1] + 0 then return left end
end
redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', ARGV[1])
return ARGV[1] + 0
