package simulate

import "github.com/tiergate/tiergate/dispatcher/queue"

// PARTIAL: the queue's token API (AdmitCost, Handle.Settle, Stats'
// QueuedTokens) is being built on another branch; until it is merged
// these admit by count alone and the queue sees no cost.

// admitCost offers r to q with its reservation.
func admitCost(q *queue.Queue, r *request) (*queue.Handle, error) {
	return q.Admit(r.ten.name, r.ten.tier.name)
}

// settleCost tells the queue what a dispatched request used.
func settleCost(*queue.Handle, int64, int64) {}

// queuedTokensOf is the reserved cost queued in each tier of st.
func queuedTokensOf(queue.Stats) func(tier string) int64 { return nil }
