package fleet

import "github.com/redis/go-redis/v9"

// Every count is a sorted set of leases: member "<dispatcherID>:<leaseID>",
// score the lease's expiry in Redis server milliseconds (TIME, so
// dispatchers' clocks never matter). A script first drops the expired
// members of the sets it counts, so ZCARD is exactly the live leases: a
// crashed dispatcher's leases stop counting the moment they expire, with no
// sweeper. Every key also gets a key-level expiry at least as long as its
// newest lease, so keys of tenants that went away vanish by themselves.
//
// All keys one script touches are passed in KEYS and share the pool's hash
// tag, so the scripts run unchanged on Redis Cluster. Requires Redis 6.2
// (ZMSCORE).

// luaPrologue is shared by the scripts: now (ms), prune and keep.
const luaPrologue = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function prune(k)
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
end
local function keep(k, ttl)
  if redis.call('PTTL', k) < ttl then
    redis.call('PEXPIRE', k, ttl)
  end
end
local function firstExpiry(k)
  local f = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #f < 2 then return 0 end
  return tonumber(f[2]) - now
end
`

// Script results.
const (
	resOK         = 0
	resTierFull   = 1 // enqueue: tier bound reached
	resTenantFull = 2 // enqueue: tenant queue limit; exchange: tenant limit
	resPoolFull   = 1 // exchange: every slot taken
)

// enqueueScript reserves a queued place.
//
//	KEYS: tierQueued, tenantQueued
//	ARGV: member, ttlMs, tierBound, tenantQueueLimit
//	returns {code, queuedInTier}: code 0 admitted (the count includes the
//	new lease), 1 tier at its bound, 2 tenant at its queue limit.
var enqueueScript = redis.NewScript(luaPrologue + `
local ttl = tonumber(ARGV[2])
prune(KEYS[1])
prune(KEYS[2])
local nt = redis.call('ZCARD', KEYS[1])
if nt >= tonumber(ARGV[3]) then return {1, nt} end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return {2, nt} end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
keep(KEYS[1], ttl)
keep(KEYS[2], ttl)
return {0, nt + 1}
`)

// exchangeScript is one exchange of the queue with the fleet: it first
// removes the leases the dispatcher gives back, hands the slots they freed
// to other starved dispatchers, then decides its claims in order, each
// turning a queued place into a slot with the same member.
//
//	KEYS: slots, waiting, starved, handoff, then per return: its two sets
//	      (slots and tenantSlots, or tierQueued and tenantQueued), then per
//	      claim: tenantSlots, tierQueued, tenantQueued
//	ARGV: ttlMs, slots, dispatcherID, channel, r (returns), holdMs,
//	      starvedMs, then per return: member; then per claim: member,
//	      tenantLimit
//	returns {code per claim…, waitMs}: code 0 granted, 1 pool full (so is
//	every later claim), 2 tenant full; waitMs is how long until the
//	earliest lease in the full set (or hold, when the pool is full)
//	expires, the latest a re-check is worth it.
//
// A refused dispatcher enters waiting for ttlMs, so releases announce
// themselves to it; refused for the pool, it also enters starved for
// starvedMs. An exchange that grants all its claims takes it out of both.
// Each slot the returns free goes, while starved dispatchers other than
// this one have no hold, to one of them as a hold (a member of handoff,
// the dispatcher, scored holdMs ahead): a hold counts as a used slot
// until its dispatcher's next exchange with claims spends it, or it
// expires. So a dispatcher that always has work cannot keep what it frees
// while another waits. When the returns (and a spent hold) freed more
// slots than the claims took and another dispatcher is waiting,
// dispatcherID is published on channel.
var exchangeScript = redis.NewScript(luaPrologue + `
local ttl, limit, me = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local r = tonumber(ARGV[5])
local holdMs, starvedMs = tonumber(ARGV[6]), tonumber(ARGV[7])
local S, W, ST, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local freed = 0
for i = 1, r do
  local a, b, m = KEYS[3 + 2 * i], KEYS[4 + 2 * i], ARGV[7 + i]
  local x = redis.call('ZREM', a, m)
  redis.call('ZREM', b, m)
  if a == S then freed = freed + x end
end
prune(S)
prune(H)
prune(ST)
local c = (#KEYS - 4 - 2 * r) / 3
local spent = 0
if c > 0 then spent = redis.call('ZREM', H, me) end
local used = redis.call('ZCARD', S) + redis.call('ZCARD', H)
if freed > 0 then
  local given = 0
  for _, d in ipairs(redis.call('ZRANGE', ST, 0, -1)) do
    if given >= freed or used >= limit then break end
    if d ~= me and not redis.call('ZSCORE', H, d) then
      redis.call('ZADD', H, now + holdMs, d)
      given = given + 1
      used = used + 1
    end
  end
  if given > 0 then keep(H, holdMs) end
end
local codes = {}
local granted, full, poolFull = 0, nil, false
local pos = 8 + r
for i = 1, c do
  local k = 4 + 2 * r + 3 * (i - 1)
  local m, lim = ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  if used >= limit then
    codes[i] = 1
    full, poolFull = S, true
  else
    prune(KEYS[k + 1])
    if redis.call('ZCARD', KEYS[k + 1]) >= lim then
      codes[i] = 2
      full = full or KEYS[k + 1]
    else
      redis.call('ZADD', S, now + ttl, m)
      redis.call('ZADD', KEYS[k + 1], now + ttl, m)
      keep(KEYS[k + 1], ttl)
      redis.call('ZREM', KEYS[k + 2], m)
      redis.call('ZREM', KEYS[k + 3], m)
      used = used + 1
      granted = granted + 1
      codes[i] = 0
    end
  end
end
if granted > 0 then keep(S, ttl) end
local wait = 0
if full then
  redis.call('ZADD', W, now + ttl, me)
  keep(W, ttl)
  wait = firstExpiry(full)
  if poolFull then
    redis.call('ZADD', ST, now + starvedMs, me)
    keep(ST, starvedMs)
    local h = firstExpiry(H)
    if h > 0 and (wait <= 0 or h < wait) then wait = h end
  else
    redis.call('ZREM', ST, me)
  end
elseif c > 0 then
  redis.call('ZREM', W, me)
  redis.call('ZREM', ST, me)
end
if freed + spent > granted then
  prune(W)
  local others = redis.call('ZCARD', W)
  if redis.call('ZSCORE', W, me) then others = others - 1 end
  if others > 0 then redis.call('PUBLISH', ARGV[4], me) end
end
codes[c + 1] = wait
return codes
`)

// removeScript ends leases outside an exchange (replayed removals, leases
// of another pool, leaving the fleet), one or many.
//
//	KEYS: waiting, then the sets
//	ARGV: channel, dispatcherID, announce, then for each set: n, n members
//	returns the number of members removed from the first set. When announce
//	is 1, that number is above 0 and a dispatcher other than this one is
//	waiting, dispatcherID is published on channel: a slot freed, and the
//	waiting dispatchers re-check. With nobody waiting, nothing is sent.
var removeScript = redis.NewScript(luaPrologue + `
local pos = 4
local first = 0
for i = 2, #KEYS do
  local n = tonumber(ARGV[pos])
  pos = pos + 1
  local s = 0
  while s < n do
    local e = math.min(n, s + 500)
    local r = redis.call('ZREM', KEYS[i], unpack(ARGV, pos + s, pos + e - 1))
    if i == 2 then first = first + r end
    s = e
  end
  pos = pos + n
end
if ARGV[3] == '1' and first > 0 then
  prune(KEYS[1])
  local others = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], ARGV[2]) then others = others - 1 end
  if others > 0 then
    redis.call('PUBLISH', ARGV[1], ARGV[2])
  end
end
return first
`)

// renewScript extends this dispatcher's leases in one batch and registers
// it as alive.
//
//	KEYS: dispatchers, then the lease sets
//	ARGV: ttlMs, dispatcherID ("" to skip registering), restore (0|1),
//	      then for each lease set: n, n members
//	returns {aliveDispatchers, missing}: missing is pairs of (index of the
//	lease set in KEYS, counting from 1 after dispatchers; member) that were
//	not in their set. With restore 1 they are added back; with 0 only the
//	members still present are extended (a lease released meanwhile is not
//	resurrected) and the caller restores the missing ones it still holds.
var renewScript = redis.NewScript(luaPrologue + `
local ttl = tonumber(ARGV[1])
local exp = now + ttl
local restore = ARGV[3] == '1'
prune(KEYS[1])
if ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[1], exp, ARGV[2])
  keep(KEYS[1], ttl)
end
local missing = {}
local pos = 4
for i = 2, #KEYS do
  local k = KEYS[i]
  local n = tonumber(ARGV[pos])
  pos = pos + 1
  prune(k)
  local s = 0
  while s < n do
    local e = math.min(n, s + 500)
    local scores = redis.call('ZMSCORE', k, unpack(ARGV, pos + s, pos + e - 1))
    local args = {}
    for j = 1, e - s do
      local m = ARGV[pos + s + j - 1]
      if scores[j] or restore then
        args[#args + 1] = exp
        args[#args + 1] = m
      end
      if not scores[j] then
        missing[#missing + 1] = i - 1
        missing[#missing + 1] = m
      end
    end
    if #args > 0 then redis.call('ZADD', k, unpack(args)) end
    s = e
  end
  pos = pos + n
  if redis.call('EXISTS', k) == 1 then keep(k, ttl) end
end
return {redis.call('ZRANGE', KEYS[1], 0, -1), missing}
`)

// countersScript adds a dispatcher's deltas to the pool's virtual token
// counters and reads back the tiers it orders; every hash it touches or
// reads lives counterTTL from then (PEXPIRE on an absent hash is a no-op).
//
//	KEYS: the counters hashes of the tiers read, then those only written
//	ARGV: number of hashes read, ttlMs, then triples of (1-based key
//	index, tenant, delta)
//	returns one HGETALL reply per hash read.
var countersScript = redis.NewScript(`
local nread = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local touched = {}
for i = 3, #ARGV, 3 do
  local k = KEYS[tonumber(ARGV[i])]
  redis.call('HINCRBYFLOAT', k, ARGV[i + 1], ARGV[i + 2])
  touched[k] = true
end
for i = 1, nread do
  touched[KEYS[i]] = true
end
for k in pairs(touched) do
  redis.call('PEXPIRE', k, ttl)
end
local out = {}
for i = 1, nread do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
`)
