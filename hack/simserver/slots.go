package main

import (
	"container/list"
	"context"
	"sync"
)

// slots admits at most n generations at once and queues the rest in
// arrival order, like vLLM's --max-num-seqs.
type slots struct {
	mu      sync.Mutex
	n, busy int
	waiting list.List // of chan struct{}
}

func newSlots(n int) *slots { return &slots{n: n} }

// acquire blocks until a slot is free or ctx ends; it returns false in the
// latter case and then holds nothing.
func (s *slots) acquire(ctx context.Context) bool {
	s.mu.Lock()
	if s.busy < s.n && s.waiting.Len() == 0 {
		s.busy++
		s.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	e := s.waiting.PushBack(ch)
	s.mu.Unlock()
	select {
	case <-ch:
		if ctx.Err() != nil {
			// The client left as the slot arrived: don't generate for nobody.
			s.release()
			return false
		}
		return true
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-ch:
			// release handed us the slot just now: pass it on.
			s.handOffLocked()
		default:
			s.waiting.Remove(e)
		}
		return false
	}
}

func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handOffLocked()
}

// handOffLocked gives the caller's slot to the oldest waiter, or frees it.
func (s *slots) handOffLocked() {
	if e := s.waiting.Front(); e != nil {
		s.waiting.Remove(e)
		close(e.Value.(chan struct{}))
		return
	}
	s.busy--
}
