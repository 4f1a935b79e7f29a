-- Blocks a subject (an operator's action): KEYS[1], its block key, lives
-- for the block (check scripts read its PTTL); its value is the block's
-- end on the server's clock (µs), for a reader's information.
-- ARGV[1]: the block's length in ms (> 0). Returns the end (µs).
local t = redis.call('TIME')
local ends = t[1] * 1000000 + t[2] + ARGV[1] * 1000
redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', ARGV[1])
return ends
