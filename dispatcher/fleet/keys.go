package fleet

import "strings"

// keyPrefix starts every key and channel. The pool name sits in a Redis
// Cluster hash tag ({…}) right after it, so all of a pool's keys hash to one
// slot and each script may touch all of them.
const keyPrefix = "tg:"

// keys names the Redis keys of one pool; the fixed ones are made once.
type keys struct {
	tag                                      string // "tg:{<escaped pool>}"
	slotsKey, waitingKey, freedKey, dispsKey string
	starvedKey, handoffKey                   string
}

// tagEscaper keeps braces out of the hash tag: Redis takes the tag from the
// first '{' to the next '}', so a brace in a pool name could otherwise end
// it early or leave it empty, splitting a pool across slots.
var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func keysFor(pool string) keys {
	tag := keyPrefix + "{" + tagEscaper.Replace(pool) + "}"
	return keys{
		tag: tag, slotsKey: tag + ":slots", waitingKey: tag + ":waiting", freedKey: tag + ":freed", dispsKey: tag + ":dispatchers",
		starvedKey: tag + ":starved", handoffKey: tag + ":handoff",
	}
}

// slots is the pool's in-flight leases (a sorted set scored by expiry).
func (k keys) slots() string { return k.slotsKey }

// tenantSlots is one tenant's in-flight leases.
func (k keys) tenantSlots(tenant string) string { return k.tag + ":slots:tenant:" + tenant }

// tierQueued is one tier's queued leases.
func (k keys) tierQueued(tier string) string { return k.tag + ":queued:tier:" + tier }

// tenantQueued is one tenant's queued leases.
func (k keys) tenantQueued(tenant string) string { return k.tag + ":queued:tenant:" + tenant }

// dispatchers is the live dispatchers of the pool, scored by expiry.
func (k keys) dispatchers() string { return k.dispsKey }

// waiting is the dispatchers the fleet refused a slot lately, scored by
// expiry: releases announce themselves only when it is not empty.
func (k keys) waiting() string { return k.waitingKey }

// starved is the dispatchers the fleet refused a slot because the pool
// was full, scored by expiry: the slots others free are handed to them.
func (k keys) starved() string { return k.starvedKey }

// handoff is the holds: a starved dispatcher, scored by when the slot held
// for it goes back to everyone. Each counts as a used slot of the pool.
func (k keys) handoff() string { return k.handoffKey }

// freed is the pub/sub channel a release announces itself on.
func (k keys) freed() string { return k.freedKey }

// hashTag returns what Redis Cluster hashes for key: the text between the
// first '{' and the next '}' when that is non-empty, else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}
