package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"k8s.io/utils/clock"
)

// DefaultCounterSync is how often Counters exchanges the virtual token
// counters with Redis while the pool has work: the most the dispatchers'
// views of a counter lag one another, beside the round trip.
const DefaultCounterSync = 50 * time.Millisecond

// counterTTL keeps a tier's counters for an hour after the last Sync that
// touched or read them, so the counters of a pool or tier that went away
// vanish by themselves. A tier no dispatcher ordered that long starts
// again from zero, which VTC allows: only differences between backlogged
// tenants matter.
const counterTTL = time.Hour

// ErrCountersUnavailable is wrapped by every error of Sync that comes from
// Redis. The charges it carried are kept and sent with the next Sync; the
// queue meanwhile orders by its own counters.
var ErrCountersUnavailable = errors.New("fleet: the token counters in Redis are unavailable")

// Counters shares the virtual token counters of Tokens fairness across the
// dispatchers of a pool (docs/fleet.md#token-fairness-across-the-fleet).
// Each tenant's counter in a tier is a field of one Redis hash per tier,
// the sum of every dispatcher's charges and corrections. Add takes this
// dispatcher's charges as deltas (never blocking: it only adds to a map);
// Sync sends the deltas gathered since the last one and reads back every
// ordered tier's hash in one script round trip. What it hands apply for a
// tenant is what the OTHER dispatchers charged it: the shared total minus
// every delta this one has sent, as queue.ApplySharedCounters wants, since
// the queue keeps its own charges in its counters already (sent or not).
//
// Concurrency: one mutex guards the pending deltas, the sent totals and
// the tiers; it is never held across the round trip or apply. Run is one
// goroutine, and Syncs must not overlap (Run never overlaps its own); Add
// and SetTiers may be called from any goroutine, Add under the queue's
// lock (it takes only its own).
type Counters struct {
	client  redis.UniversalClient
	timeout time.Duration
	clk     clock.WithTicker
	log     logr.Logger
	apply   func(tier string, counters map[string]float64)

	mu      sync.Mutex
	keys    keys
	tiers   []string
	pending map[string]map[string]float64 // tier → tenant → delta not sent yet
	own     map[string]map[string]float64 // tier → tenant → every delta sent
	failing bool                          // the last Sync failed (logged once)
}

// Counters returns the shared counters of the pool in the Redis this Gate
// uses. apply receives each tier's counters after every Sync; it is called
// without Counters' lock, one tier at a time, from the goroutine that
// called Sync.
func (g *Redis) Counters(apply func(tier string, counters map[string]float64)) *Counters {
	return &Counters{client: g.client, timeout: g.cfg.OpTimeout, clk: g.clk, log: g.log, apply: apply,
		pending: map[string]map[string]float64{}, own: map[string]map[string]float64{}}
}

// SetTiers names the pool and the tiers in Tokens fairness whose counters
// Sync reads. A pool change forgets the pending and sent deltas: they
// were the old pool's.
func (c *Counters) SetTiers(pool string, tiers []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := keysFor(pool)
	if k.tag != c.keys.tag {
		clear(c.pending)
		clear(c.own)
	}
	c.keys = k
	c.tiers = slices.Sorted(slices.Values(tiers))
}

// Add records a charge (or a correction, when negative) of delta to
// tenant's counter in tier, sent with the next Sync.
func (c *Counters) Add(tier, tenant string, delta float64) {
	if delta == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.pending[tier]
	if m == nil {
		m = map[string]float64{}
		c.pending[tier] = m
	}
	m[tenant] += delta
}

// counterKey is one tier's counters hash.
func (k keys) counters(tier string) string { return k.tag + ":vtc:" + tier }

// Sync sends the pending deltas and reads every ordered tier's counters:
// one round trip of countersScript. On failure the deltas it carried are
// pending again, so none is lost or sent twice (except a delta Redis
// applied whose answer was lost: it is sent again).
func (c *Counters) Sync(ctx context.Context) error { return c.send(ctx, c.take()) }

// counterBatch is what one Sync sends: the pool, the tiers it reads, the
// deltas.
type counterBatch struct {
	keys  keys
	tiers []string
	sent  map[string]map[string]float64
}

// take empties pending into a batch.
func (c *Counters) take() counterBatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := counterBatch{keys: c.keys, tiers: c.tiers, sent: c.pending}
	c.pending = map[string]map[string]float64{}
	return b
}

// send runs one batch's round trip and applies its answer.
func (c *Counters) send(ctx context.Context, b counterBatch) error {
	if b.keys.tag == "" || (len(b.tiers) == 0 && len(b.sent) == 0) {
		c.restore(b.sent)
		return nil
	}
	keyList, argv := counterArgs(b.keys, b.tiers, b.sent)
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := countersScript.Run(ctx, c.client, keyList, argv...).Slice()
	if err == nil && len(res) != len(b.tiers) {
		err = fmt.Errorf("the script answered %d tiers, want %d", len(res), len(b.tiers))
	}
	if err != nil {
		c.restore(b.sent)
		c.noteFailure(err)
		return fmt.Errorf("%w: %w", ErrCountersUnavailable, err)
	}
	c.noteSuccess()
	others := make([]map[string]float64, len(b.tiers))
	for i, tier := range b.tiers {
		shared, err := parseCounters(res[i])
		if err != nil {
			return fmt.Errorf("%w: tier %q: %w", ErrCountersUnavailable, tier, err)
		}
		others[i] = shared
	}
	c.settle(b, others)
	for i, tier := range b.tiers {
		c.apply(tier, others[i])
	}
	return nil
}

// settle adds a batch Redis applied to the sent totals and turns each
// tier's shared totals into what the other dispatchers charged, in place.
// A total below what this dispatcher sent means the hash expired (or was
// lost) since: this dispatcher's share is then taken to be all of it.
func (c *Counters) settle(b counterBatch, shared []map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.keys.tag != c.keys.tag {
		return // the pool changed meanwhile: own was cleared
	}
	for tier, m := range b.sent {
		o := c.own[tier]
		if o == nil {
			o = map[string]float64{}
			c.own[tier] = o
		}
		for tenant, d := range m {
			o[tenant] += d
		}
	}
	for i, tier := range b.tiers {
		o := c.own[tier]
		for tenant, total := range shared[i] {
			mine := o[tenant]
			if total < mine {
				o[tenant] = total
				mine = total
			}
			shared[i][tenant] = total - mine
		}
	}
}

// counterArgs lays out the script's input: the tiers' hashes (read back)
// followed by the hashes only written to, and ARGV of the number of read
// keys, then triples of key index (1-based), tenant and delta.
func counterArgs(k keys, tiers []string, sent map[string]map[string]float64) ([]string, []any) {
	keyList := make([]string, 0, len(tiers)+len(sent))
	index := map[string]int{}
	for _, t := range tiers {
		keyList = append(keyList, k.counters(t))
		index[t] = len(keyList)
	}
	argv := []any{len(tiers), counterTTL.Milliseconds()}
	for _, tier := range slices.Sorted(mapKeys(sent)) {
		i, ok := index[tier]
		if !ok {
			keyList = append(keyList, k.counters(tier))
			i = len(keyList)
			index[tier] = i
		}
		for _, tenant := range slices.Sorted(mapKeys(sent[tier])) {
			argv = append(argv, i, tenant, strconv.FormatFloat(sent[tier][tenant], 'g', -1, 64))
		}
	}
	return keyList, argv
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// restore puts deltas that were not sent back into pending.
func (c *Counters) restore(sent map[string]map[string]float64) {
	if len(sent) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for tier, m := range sent {
		for tenant, d := range m {
			p := c.pending[tier]
			if p == nil {
				p = map[string]float64{}
				c.pending[tier] = p
			}
			p[tenant] += d
		}
	}
}

func (c *Counters) noteFailure(err error) {
	c.mu.Lock()
	first := !c.failing
	c.failing = true
	c.mu.Unlock()
	if first {
		c.log.Info("token counters unavailable in Redis; ordering by this dispatcher's own until they answer", "err", err.Error())
	}
}

func (c *Counters) noteSuccess() {
	c.mu.Lock()
	was := c.failing
	c.failing = false
	c.mu.Unlock()
	if was {
		c.log.Info("token counters in Redis answer again")
	}
}

// parseCounters reads HGETALL's flat reply of tenant, value pairs.
func parseCounters(v any) (map[string]float64, error) {
	flat, ok := v.([]any)
	if !ok || len(flat)%2 != 0 {
		return nil, fmt.Errorf("counters reply %T of the wrong shape", v)
	}
	out := make(map[string]float64, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		tenant, ok1 := flat[i].(string)
		s, ok2 := flat[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("counters reply entry %d of the wrong shape", i/2)
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("counter of %q: %w", tenant, err)
		}
		out[tenant] = f
	}
	return out, nil
}

// Run syncs every interval while active says the local queue has work in
// a Tokens tier or deltas are pending, until ctx ends. A failed Sync is
// retried at the next tick.
func (c *Counters) Run(ctx context.Context, interval time.Duration, active func() bool) {
	if interval <= 0 {
		interval = DefaultCounterSync
	}
	t := c.clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		c.mu.Lock()
		pending := len(c.pending) > 0
		c.mu.Unlock()
		if pending || active() {
			_ = c.Sync(ctx) // logged by noteFailure; retried next tick
		}
	}
}
