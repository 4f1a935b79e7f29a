-- Lifts a subject's block (an operator's action): deletes its block key,
-- KEYS[1], and its entry in the limiter's block index, KEYS[3], when given;
-- the limiter's block marker, KEYS[2], goes with the index's last entry
-- (rate_block_set.lua).
redis.call('DEL', KEYS[1])
if KEYS[3] then
  redis.call('ZREM', KEYS[3], string.match(KEYS[1], '{[^}]*}'))
  if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('DEL', KEYS[2]) end
end
return 1
