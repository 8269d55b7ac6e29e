package queue

// iheap is an indexed binary min-heap: each element keeps its own index
// (through at) so that fix and removal are O(log n). Tokens fairness keeps
// three of them per tier and one of tiers (fair.go); the Requests-mode heap
// stays hand-written (heap.go), the hot path of the default mode.
type iheap[T comparable] struct {
	s    []T
	less func(a, b T) bool
	at   func(T) *int // the element's index, -1 when absent
}

func (h *iheap[T]) len() int { return len(h.s) }

func (h *iheap[T]) top() T { return h.s[0] }

func (h *iheap[T]) has(x T) bool { return *h.at(x) >= 0 }

func (h *iheap[T]) swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	*h.at(h.s[i]) = i
	*h.at(h.s[j]) = j
}

func (h *iheap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.s[i], h.s[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *iheap[T]) down(i0 int) bool {
	i, n := i0, len(h.s)
	for {
		l := 2*i + 1
		if l >= n || l < 0 {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(h.s[r], h.s[l]) {
			c = r
		}
		if !h.less(h.s[c], h.s[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}

// set puts x in (in), moves it to its place, or takes it out (!in).
func (h *iheap[T]) set(x T, in bool) {
	i := *h.at(x)
	switch {
	case in && i < 0:
		*h.at(x) = len(h.s)
		h.s = append(h.s, x)
		h.up(len(h.s) - 1)
	case in:
		if !h.down(i) {
			h.up(i)
		}
	case i >= 0:
		n := len(h.s) - 1
		if i != n {
			h.swap(i, n)
		}
		var zero T
		h.s[n] = zero
		h.s = h.s[:n]
		*h.at(x) = -1
		if i != n && !h.down(i) {
			h.up(i)
		}
	}
}

// reset empties the heap; the caller resets the elements' indexes.
func (h *iheap[T]) reset() {
	clear(h.s)
	h.s = h.s[:0]
}

// build makes a heap of xs in O(n); xs must not be in the heap.
func (h *iheap[T]) build(xs []T) {
	h.reset()
	for _, x := range xs {
		*h.at(x) = len(h.s)
		h.s = append(h.s, x)
	}
	for i := len(h.s)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}
