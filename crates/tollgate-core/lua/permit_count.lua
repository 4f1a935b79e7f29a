-- How many permits are held now (expired holders not counted; read-only).
-- KEYS[1]: the holders.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
