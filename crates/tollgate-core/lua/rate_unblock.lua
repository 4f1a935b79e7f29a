-- Lifts a subject's block (an operator's action): deletes its block key,
-- KEYS[1], and its entry in the limiter's block index, KEYS[2], when given
-- (rate_block_set.lua).
redis.call('DEL', KEYS[1])
if KEYS[2] then redis.call('ZREM', KEYS[2], string.match(KEYS[1], '{[^}]*}')) end
return 1
