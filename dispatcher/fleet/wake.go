package fleet

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// signal asks the waker to Kick the queue; bursts coalesce.
func (g *Redis) signal(source string) {
	g.m.wakeups.WithLabelValues(source).Inc()
	select {
	case g.wakeCh <- struct{}{}:
	default:
	}
}

func (g *Redis) renewSoon() {
	select {
	case g.renewCh <- struct{}{}:
	default:
	}
}

// waker calls the queue's Kick for coalesced wake-up signals, outside any
// Gate or queue lock.
func (g *Redis) waker() {
	defer g.wg.Done()
	for {
		select {
		case <-g.stop:
			return
		case <-g.wakeCh:
			g.mu.Lock()
			w := g.wake
			g.mu.Unlock()
			if w != nil {
				w()
			}
		}
	}
}

// resubscribe points the subscriber at the current pool's channel.
func (g *Redis) resubscribe() {
	g.mu.Lock()
	ps := g.ps
	want := ""
	if g.fleet {
		want = keysFor(g.pool).freed()
	}
	old := g.subscribed
	if ps == nil || want == old {
		g.mu.Unlock()
		return
	}
	g.subscribed = want
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
	defer cancel()
	if old != "" {
		_ = ps.Unsubscribe(ctx, old)
	}
	if want != "" {
		// Remembered even if this fails; the subscriber's reconnection
		// subscribes again.
		_ = ps.Subscribe(ctx, want)
	}
}

// subscriber turns "slot freed" messages of other dispatchers into
// wake-ups. After a reconnection it wakes the queue too, since messages
// may have been lost meanwhile. Errors back off up to the re-check
// interval; the re-check timer covers whatever is missed.
func (g *Redis) subscriber() {
	defer g.wg.Done()
	g.mu.Lock()
	ps := g.ps
	g.mu.Unlock()
	backoff := minRecheck
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), 2*g.cfg.RecheckInterval)
		select {
		case <-g.stop:
			return
		default:
		}
		if err != nil {
			if isTimeout(err) {
				// Quiet channel: a PING proves the connection still works.
				ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
				_ = ps.Ping(ctx)
				cancel()
				continue
			}
			select {
			case <-g.stop:
				return
			case <-g.clk.After(backoff):
			}
			backoff = min(2*backoff, g.cfg.RecheckInterval)
			continue
		}
		backoff = minRecheck
		g.received(msg)
	}
}

// received turns one pub/sub message into a wake-up.
func (g *Redis) received(msg any) {
	switch m := msg.(type) {
	case *redis.Message:
		if m.Payload != g.id {
			g.signal(wakePubSub)
		}
	case *redis.Subscription:
		if m.Kind == "subscribe" {
			g.signal(wakeResub)
		}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
