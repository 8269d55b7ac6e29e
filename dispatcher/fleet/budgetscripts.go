package fleet

import "github.com/redis/go-redis/v9"

// A tenant's budgets live in one hash, tg:{pool}:budget:<tenant>, with a
// level and a time per bucket: rl, rt (requests) and tl, tt (tokens). The
// maths is the tokens package's (bucket.go), step for step, so that Local
// and Redis compute the same integers: a level is in units, U (the window
// in milliseconds) per token, so a bucket of limit C refills exactly C
// units per millisecond; a time is the Redis server's clock (TIME) in whole
// milliseconds, so dispatchers' clocks never matter. Every number stays an
// integer below 2^53, which Lua's doubles hold exactly, and so are the
// floors and ceilings of their quotients. A missing field is a bucket
// never seen: full.
//
// Both scripts start with the prologue: for each budget the limits have
// (C > 0; a limit of 0 leaves that bucket's fields alone), refill the
// bucket (full if new or idle for two windows; else its level raised to
// at least −F, then min(F, level + C × elapsed), F = C × U; a clock going
// backwards adds nothing and the later time is kept). Then they decide,
// store both buckets with their times, set the key to expire after the
// two windows that make it full anyway, and reply with the Decision's
// numbers:
//
//	{code, retryAfterMs, requests limit, remaining, resetMs,
//	 tokens limit, remaining, resetMs}
//
// code: 0 admitted, 1 refused by the requests budget, 2 by the tokens
// budget, 3 by the tokens budget for ever (more than its limit). A budget
// the limits do not have answers 0, 0, 0.

// Reserve codes.
const (
	budgetOK            = 0
	budgetRequestsShort = 1
	budgetTokensShort   = 2
	budgetTokensNever   = 3
)

// budgetPrologue reads and refills the buckets.
//
//	KEYS: the budget hash
//	ARGV: U (units per token, the window in ms), requests limit, tokens
//	      limit (each at most tokens' MaxLimit, 0 for none), …
const budgetPrologue = `
local U = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lim = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local names = {{'rl', 'rt'}, {'tl', 'tt'}}
local v = redis.call('HMGET', KEYS[1], 'rl', 'rt', 'tl', 'tt')
local lvl, last = {}, {}
for i = 1, 2 do
  local c = lim[i]
  if c > 0 then
    local full = c * U
    local l, a = tonumber(v[2 * i - 1]), tonumber(v[2 * i])
    if not l or not a or now - a >= 2 * U then
      l = full
    else
      l = math.min(full, math.max(l, -full) + c * math.max(0, now - a))
    end
    lvl[i], last[i] = l, math.max(a or 0, now)
  end
end
local function ceildiv(a, b) return math.floor((a + b - 1) / b) end
local function wait(i, n)
  if lvl[i] >= n * U then return 0 end
  return math.max(1, ceildiv(n * U - lvl[i], lim[i]))
end
local function f(x) return string.format('%.17g', x) end
local function finish(code, retry)
  local out = {code, retry, 0, 0, 0, 0, 0, 0}
  for i = 1, 2 do
    local c = lim[i]
    if c > 0 then
      redis.call('HSET', KEYS[1], names[i][1], f(lvl[i]), names[i][2], f(last[i]))
      out[3 * i] = c
      out[3 * i + 1] = math.max(0, math.floor(lvl[i] / U))
      out[3 * i + 2] = ceildiv(c * U - lvl[i], c)
    end
  end
  redis.call('PEXPIRE', KEYS[1], 2 * U)
  return out
end
`

// reserveScript takes one request and n tokens from a tenant's buckets,
// from both or from neither. More than the whole tokens limit is refused
// for ever; otherwise the requests budget is named when both are short,
// and the wait is the longer of the short buckets' (at least 1 ms).
//
//	ARGV: U, requests limit, tokens limit, n (>= 0)
var reserveScript = redis.NewScript(budgetPrologue + `
local n = tonumber(ARGV[4])
if lim[2] > 0 and n > lim[2] then return finish(3, 0) end
local reqShort = lim[1] > 0 and lvl[1] < U
local tokShort = lim[2] > 0 and lvl[2] < n * U
if reqShort or tokShort then
  local code, retry = 2, 0
  if reqShort then code, retry = 1, wait(1, 1) end
  if tokShort then retry = math.max(retry, wait(2, n)) end
  return finish(code, retry)
end
if lim[1] > 0 then lvl[1] = lvl[1] - U end
if lim[2] > 0 then lvl[2] = lvl[2] - n * U end
return finish(0, 0)
`)

// settleScript corrects a tenant's buckets after a request: the tokens
// bucket gains d tokens (reserved − used; negative takes them), the
// requests bucket one request when refund is 1. What one settlement gives
// or takes is at most two windows' worth (2C), and a level stays within
// [−F, F]: a bucket owes at most one window.
//
//	ARGV: U, requests limit, tokens limit, d, refund (0|1)
var settleScript = redis.NewScript(budgetPrologue + `
local function give(i, x)
  local c = lim[i]
  local full = c * U
  x = math.max(-2 * c, math.min(2 * c, x))
  lvl[i] = math.max(-full, math.min(full, lvl[i] + x * U))
end
if lim[1] > 0 and ARGV[5] == '1' then give(1, 1) end
if lim[2] > 0 then give(2, tonumber(ARGV[4])) end
return finish(0, 0)
`)
