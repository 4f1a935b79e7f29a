-- EXPERIMENT: the floor of any server-clocked one-integer limiter — TIME, GET
-- and SET ... PX of a constant, nothing else. No limiter can do less work.
local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '1764812345678901', 'PX', 1000)
return {1, 0, 0, 0}
