-- Epilogue of the five settle scripts: the subject's figures after settling,
-- as a check of cost 0 reports them — the algorithm's own check script
-- (`check`, see settle_prelude.lua) on the quota keys, without a block key.
-- Returns {applied (1 or 0), then the check's reply: allowed, now, and per
-- quota remaining, reset_after_us, retry_after_us, next_us}.
local keys, args = {}, {ARGV[1], '0', ARGV[3]}
for i = 1, q do
  keys[i] = KEYS[i + 1]
  args[2 + 2 * i], args[3 + 2 * i] = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
end
cost, n = 0, q
local reply = check(keys, args)
table.insert(reply, 1, applied and 1 or 0)
return reply
