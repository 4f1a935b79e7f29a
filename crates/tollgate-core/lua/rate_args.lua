-- The arguments of one rate-limit script call, read first (the loader puts
-- this before rate_prelude.lua; the batch script sets the same three locals
-- per decision instead, see rate_batch.lua).
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost.
local now = ARGV[1] ~= '' and tonumber(ARGV[1]) -- '' (the default) skips a strtod
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] -- string to number by arithmetic: cheaper than tonumber
end
-- Arithmetic coerces a string with one strtod; tonumber() runs two.
local cost = ARGV[2] + 0
local n = #KEYS
