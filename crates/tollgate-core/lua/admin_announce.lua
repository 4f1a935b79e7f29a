-- Announces an admin action to every instance: bumps the version stamp and
-- publishes '<version> <message>' on the admin channel, in one step, so a
-- watcher that sees a version it did not expect knows it missed one.
-- KEYS[1]: the version stamp. ARGV[1]: the channel. ARGV[2]: the message.
-- ARGV[3]: the stamp's TTL in ms. A foreign value under the stamp starts it
-- over (watchers then forget everything). Returns the new version.
local v = redis.pcall('INCR', KEYS[1])
if type(v) ~= 'number' then
  redis.call('SET', KEYS[1], 1)
  v = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[1], string.format('%d', v) .. ' ' .. ARGV[2])
return v
